"""The probe's record of one rank: steps, backward passes, epochs, writes, prints, and the final dump.

Part of the probe (see probe.py): the standard library and torch only, never ddpify. The hooks
(probe_hooks.py) call the methods here; any exception inside them is recorded in the rank's
record (`probe_errors`) and swallowed, never raised into the script: only StopVerify leaves.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import sys
import time

if __package__:
    from ddpify.verify import probe_models as M
    from ddpify.verify import probe_values as V
else:  # started by path in a rank: probe.py loads its parts by their file names
    import probe_models as M  # type: ignore[no-redef]
    import probe_values as V  # type: ignore[no-redef]

RUN_DIR = os.environ.get("DDPIFY_VERIFY_DIR", "")
MAX_STEPS = int(os.environ.get("DDPIFY_VERIFY_STEPS", "20"))
# --epochs N: run N whole training epochs (and what the script does at their end) instead of K steps.
EPOCHS = int(os.environ.get("DDPIFY_VERIFY_EPOCHS", "0") or 0)
# The default run: two epochs (their end-of-epoch work twice), with K only a ceiling for a script
# without DataLoader epochs; each loader's pass capped at MAX_BATCHES, the run at MAX_TIME seconds.
AUTO = os.environ.get("DDPIFY_VERIFY_AUTO") == "1"
if EPOCHS and not AUTO:
    MAX_STEPS = 1 << 62
MAX_BATCHES = int(os.environ.get("DDPIFY_VERIFY_MAX_BATCHES", "0") or 0)
MAX_TIME = float(os.environ.get("DDPIFY_VERIFY_MAX_TIME", "0") or 0)
# The file the user named: __file__, sys.argv[0] and sys.path[0] follow it even when the
# converted copy (EXEC_PATH) is what runs.
MAIN_FILE = os.environ.get("DDPIFY_VERIFY_MAIN_FILE", "")
# The folder whose files are the user's code (the project's root; else the script's folder).
USER_ROOT = os.environ.get("DDPIFY_VERIFY_USER_ROOT", "")
# Above this many parameters the dump keeps an evenly strided sample of each tensor.
MAX_DUMP_NUMEL = 16_000_000
MAX_INDICES_PER_EPOCH = 1_000_000
MAX_FINGERPRINTS = 8  # batches per epoch of an IterableDataset
MAX_STEP_PRINTS = 64  # training forwards/backwards of the DDP model whose inputs and local gradients are kept
MAX_PRINT_SITES = 200
MAX_PROBE_ERRORS = 20
MAX_COLLECTIVES = 4096  # collectives whose kind and line are kept in order, per rank
# what a collective the probe notes is on the wire, where its name says something else
COLLECTIVE_KINDS = {
    "backward": "all_reduce",
    "the DDP forward (buffer broadcast)": "broadcast",
    "DistributedDataParallel()": "broadcast",
}
HEARTBEAT_S = 0.25
PROBE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
real_open = builtins.open  # before the hooks wrap it: the probe's own files


class StopVerify(BaseException):
    """Raised from a hook after step K; BaseException so `except Exception` in the script lets it through."""


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Probe:
    def __init__(self, exec_path: str, main_file: str) -> None:
        self.rank = env_int("RANK", 0)
        self.local_rank = env_int("LOCAL_RANK", 0)
        self.world_size = env_int("WORLD_SIZE", 1)
        self.exec_path = os.path.abspath(exec_path)
        self.main_file = os.path.abspath(main_file)
        self.user_dir = (
            os.path.abspath(USER_ROOT) if USER_ROOT else os.path.dirname(self.main_file)
        )
        self.user_files = {self.exec_path, self.main_file}
        self.prefix = os.path.join(RUN_DIR, f"rank{self.rank}")
        self.record: dict = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node": env_int("GROUP_RANK", 0),
            "pid": os.getpid(),
            "t_start": time.time(),
            "status": "running",
            "init": None,
            "set_device": [],
            "ddp": [],
            "writes": [],
            "outside_writes": {"n": 0, "sample": []},
            "set_epoch_calls": [],
            "one_shard": [],  # lines printed right after an evaluation over one shard, with no collective between
        }
        self.printed: dict[tuple[str, str], dict] = {}
        self.opt_steps: dict[int, int] = {}
        self.step = 0
        self.backward = 0
        self.batches = 0
        self.samples = 0
        self.samples_known = False
        self.optimizers: list = []
        self.ddp_modules: list = []
        self.losses: list = []
        self.marks: list[tuple[float, int]] = []
        self.epochs: list[dict] = []
        self.last_epoch: dict | None = None
        self.train_epochs_done = 0
        self.last_scaled = None  # (scaled tensor, unscaled loss) from GradScaler.scale
        # without a DataLoader, sharding shows in what the DDP model sees: its training inputs,
        # and the gradients each rank computes before DDP averages them
        self.input_prints: list = []
        self.grad_prints: dict[int, list[float]] = {}
        self.in_probe = False  # our own writes are not the script's
        self.events = 0  # milestones (hooks installed, group initialised, DDP built): progress before step 1
        self.hb_time = 0.0
        self.hb_fd = os.open(
            self.prefix + ".hb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
        # every collective this rank entered (torch.distributed's, a DDP forward, a backward that
        # all-reduces): its count, what it was and the script's line, overwritten in place, so a
        # rank that hangs or dies mid-collective still tells where it was
        self.coll_n = 0
        self.site_index: dict[str, int] = {}
        self.last_eval: dict | None = None
        self.coll_fd = os.open(
            self.prefix + ".coll", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
        self.t0 = time.monotonic()
        self.stop_at: int | None = (
            None  # the step every rank stops at when the time is up
        )
        self.record.update(stopped_by=None, states=[], failed_imports=[])
        self.real_open = real_open
        self.real_save = None  # torch.save before the hooks wrap it
        self.models = M.StateWatch(self)
        self.iter_len = len  # a DataLoader iterator's own length (the hooks cap the one the script sees)
        self.heartbeat()

    # ---------------------------------------------------------------- bookkeeping

    def safe(self, what: str, fn, *args):
        """Run one of the probe's own hooks: whatever it raises (StopVerify aside) is recorded, not raised."""
        try:
            return fn(*args)
        except Exception as exc:
            errors = self.record.setdefault("probe_errors", [])
            if len(errors) < MAX_PROBE_ERRORS:
                errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
            return None

    def heartbeat(self, force: bool = True) -> None:
        # A fixed-size overwrite: the parent reads progress from it to spot a hang. Steps and
        # milestones always write; batches and backward passes at most every HEARTBEAT_S.
        now = time.monotonic()
        if not force and now - self.hb_time < HEARTBEAT_S:
            return
        self.hb_time = now
        line = (
            f"{self.step} {self.backward} {self.batches} {self.events}".ljust(63) + "\n"
        )
        os.pwrite(self.hb_fd, line.encode(), 0)

    def milestone(self) -> None:
        self.events += 1
        self.heartbeat()
        self.save_record()

    def save_record(self) -> None:
        self.in_probe = True
        try:
            if self.last_epoch is not None and not self.last_epoch["complete"]:
                self.last_epoch["bw_last"] = self.backward
            rec = dict(self.record)
            rec.update(
                steps=self.step,
                backward=self.backward,
                batches=self.batches,
                samples=self.samples if self.samples_known else None,
                mode="step" if self.optimizers else "backward",
                marks=self.marks,
                epochs=[
                    {k: v for k, v in e.items() if not k.startswith("_")}
                    for e in self.epochs
                ],
                input_prints=self.input_prints,
                grad_prints=[self.grad_prints[k] for k in sorted(self.grad_prints)],
                printed=list(self.printed.values()),
                t_saved=time.time(),
            )
            tmp = self.prefix + ".json.tmp"
            with real_open(tmp, "w") as f:
                json.dump(rec, f, default=str)
            os.replace(tmp, self.prefix + ".json")
        finally:
            self.in_probe = False

    def user_frames(self) -> list:
        """The frames of the script's own code on the stack now, the outermost first."""
        out = []
        f = sys._getframe(1)
        while f is not None:
            if self.is_user_frame(f.f_code.co_filename):
                out.append(f)
            f = f.f_back
        return out[::-1]

    def is_user_frame(self, filename: str) -> bool:
        if filename in self.user_files:
            return True
        return (
            filename.startswith(self.user_dir + os.sep)
            and "site-packages" not in filename
            and "dist-packages" not in filename
            and not filename.startswith(PROBE_DIR)
        )

    def callers(self, skip: int = 1) -> tuple[str, bool, str | None, list[str]]:
        """(module of the direct caller outside the probe, whether that caller is the user's code,
        the innermost user frame as "path:line" or None, the modules passed on the way)."""
        f = sys._getframe(skip)
        direct, direct_user, passed = None, False, []
        depth = 0
        while f is not None and depth < 80:
            name = f.f_code.co_filename
            if not name.startswith(PROBE_DIR):
                user = self.is_user_frame(name)
                if direct is None:
                    direct, direct_user = f.f_globals.get("__name__", "") or "", user
                if user:
                    return direct, direct_user, f"{name}:{f.f_lineno}", passed
                passed.append(f.f_globals.get("__name__", "") or "")
            f = f.f_back
            depth += 1
        return direct or "", direct_user, None, passed

    def note_write(self, path, kind: str) -> dict | None:
        if self.in_probe:
            return None
        if isinstance(path, int) or not isinstance(path, (str, bytes, os.PathLike)):
            return None
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        if full.startswith(("/dev/", "/proc/", "/sys/")):
            return None
        run_dir = os.path.realpath(RUN_DIR) if RUN_DIR else ""
        try:
            cwd = os.path.realpath(os.getcwd())
        except OSError:  # the script removed its own working directory
            cwd = "/nonexistent"
        # Under --nnodes each node's working directory lies in the run directory: its files are the script's.
        if (
            run_dir
            and full.startswith(run_dir + os.sep)
            and not full.startswith(cwd + os.sep)
        ):
            return None
        direct, by_user, where, _ = self.callers(1)
        if where is None:
            return (
                None  # a library's own cache or log, not something the script asked for
            )
        why = V.outside_write(
            full,
            direct,
            by_user,
            (cwd, os.path.dirname(os.path.realpath(MAIN_FILE)) if MAIN_FILE else ""),
        )
        if (
            why is not None
        ):  # a compiler's cache, a tracker's media: not an output of the script
            other = self.record["outside_writes"]
            other["n"] += 1
            if len(other["sample"]) < 5:
                other["sample"].append({"path": full, "why": why})
            return None
        if len(self.record["writes"]) >= 1000:
            return None
        # The same file on every node's disk has the same path relative to that node's working directory.
        rel = os.path.relpath(full, cwd) if full.startswith(cwd + os.sep) else full
        entry = {
            "path": full,
            "rel": rel,
            "kind": kind,
            "where": where,
            "new": not os.path.lexists(full),
        }
        self.record["writes"].append(entry)
        return entry

    def note_failed_import(self, name: str, exc: BaseException, globals_) -> None:
        """An import in the script's own code that failed here; if the script goes on, it took
        another path than where the module is installed (a CUDA-only package on the CPU)."""
        file = (globals_ or {}).get("__file__") if isinstance(globals_, dict) else None
        found = self.record["failed_imports"]
        if (
            not isinstance(file, str)
            or not self.is_user_frame(file)
            or len(found) >= 20
        ):
            return
        f = sys._getframe(
            2
        )  # note_failed_import <- safe <- the import hook <- the importer
        while f is not None and f.f_code.co_filename != file:
            f = f.f_back
        where = f"{file}:{f.f_lineno}" if f is not None else file
        if not any(x["where"] == where for x in found):
            found.append({"module": name, "where": where, "error": str(exc)[:160]})

    def note_output(self, stream: str, text: str) -> None:
        """Where the script printed (print, sys.stdout.write, a logging handler): one entry per line of code."""
        if self.in_probe or not text.strip() or _discarded(stream):
            return
        _, _, where, passed = self.callers(1)
        if where is None or any(m in ("warnings", "traceback") for m in passed):
            return  # a library's message, a warning or a traceback: not the script's own output
        key = (where, stream)
        entry = self.printed.get(key)
        lines = [
            s.strip()[:200] for s in text.splitlines() if s.strip()
        ]  # "\r" too: a progress bar's states
        if entry is None:
            if len(self.printed) >= MAX_PRINT_SITES:
                return
            entry = self.printed[key] = {
                "where": where,
                "stream": stream,
                "n": 0,
                "text": lines[0],
                "last": lines[0],
            }
        entry["n"] += 1
        entry["last"] = lines[-1]
        ev = self.last_eval
        if (
            ev is not None
            and ev.get("coll_end") == self.coll_n
            and any(c.isdigit() for c in text)
            and len(self.record["one_shard"]) < 8
        ):
            self.record["one_shard"].append(
                {
                    "where": where,
                    "text": lines[-1][:160],
                    "seq": ev["seq"],
                    "drawn": ev.get("drawn"),
                    "dataset_len": ev.get("dataset_len"),
                }
            )

    def mark_step(self) -> None:
        import torch

        if self.step == 1 or self.step == MAX_STEPS:
            # The throughput window runs from step 1 to step K: sync its ends so queued GPU work counts.
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        self.marks.append((time.perf_counter(), self.samples))
        self.heartbeat()
        if self.step == 1:
            self.save_record()

    # ---------------------------------------------------------------- what the hooks report

    def on_optimizer_step(self, optimizer) -> None:
        key = id(optimizer)
        self.opt_steps[key] = self.opt_steps.get(key, 0) + 1
        step = max(self.opt_steps.values())
        if step != self.step:
            self.step = step
            self.mark_step()
            if step == 1:  # what the script holds, while its frames are there to walk
                self.safe("models", self.models.discover)
            if self.step >= MAX_STEPS:
                self.stop("steps")
            if self.time_up():
                self.stop("time")

    def stop(self, why: str) -> None:
        self.record["stopped_by"] = why
        self.safe("models", self.models.discover)
        raise StopVerify

    def time_up(self) -> bool:
        """Past MAX_TIME: rank 0 names a step two ahead (no rank can be further while DDP keeps
        them in step) in a file, and every rank stops there; the probe runs no collective."""
        if not MAX_TIME:
            return False
        path = os.path.join(RUN_DIR, "stop-at")
        if self.stop_at is None and os.path.exists(path):
            try:
                with real_open(path) as f:
                    self.stop_at = int(f.read())
            except (OSError, ValueError):
                pass
        if (
            self.stop_at is None
            and self.rank == 0
            and time.monotonic() - self.t0 > MAX_TIME
        ):
            self.stop_at = self.step + (2 if self.world_size > 1 else 0)
            with real_open(path + ".tmp", "w") as f:
                f.write(str(self.stop_at))
            os.replace(path + ".tmp", path)
        return self.stop_at is not None and self.step >= self.stop_at

    def should_stop_before_backward(self) -> bool:
        # --epochs: N whole epochs done, and whatever the script did after them up to this next backward.
        # A hand-stepped script: K backward passes and their updates are done; stop before the next.
        if EPOCHS and self.train_epochs_done >= EPOCHS:
            self.stop("epochs")
        if not self.optimizers and self.backward >= MAX_STEPS:
            self.stop("steps")
        if not self.optimizers and self.time_up():
            self.stop("time")
        return False

    def on_backward(self, tensors) -> None:
        import torch

        self.backward += 1
        t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if isinstance(t, torch.Tensor):
            if self.last_scaled is not None and self.last_scaled[0] is t:
                t = self.last_scaled[1]
            self.last_scaled = None
            val = t.detach()
            if val.is_complex():
                val = val.abs()
            if val.dim():
                val = val.float().mean()
            if len(self.losses) < 100_000:
                self.losses.append(val)
            if "loss_device" not in self.record:
                self.record["loss_device"] = str(val.device)
        if not self.optimizers:
            self.step = self.backward
            self.mark_step()
            if self.step == 1:
                self.safe("models", self.models.discover)
        else:
            self.heartbeat(force=False)

    def on_batch(self, it, data) -> None:
        self.batches += 1
        n = V.batch_len(data)
        if n is not None:
            self.samples += n
            self.samples_known = True
        rec = it.__dict__.get("_ddpify_epoch")
        if rec is not None:
            rec["drawn"] += 1
            import torch

            # a batch drawn under no_grad (a validation batch from a shared cycle()) trains nothing
            rec["grad_on"] = rec.get("grad_on", 0) + int(torch.is_grad_enabled())
            if rec["iterable"] and len(rec["fingerprints"]) < MAX_FINGERPRINTS:
                # No indices to compare for an IterableDataset: compare what the batches hold instead.
                rec["fingerprints"].append(V.fingerprint(data))
            if rec["bw_first"] is None:
                rec["bw_first"] = self.backward
            rec["bw_last"] = self.backward
            self.last_epoch = rec
        self.heartbeat(force=False)

    def on_collective(self, what: str) -> None:
        self.coll_n += 1
        _, _, where, _ = self.callers(3)
        line = f"{self.coll_n}\t{what}\t{where or '?'}"[:480].ljust(511) + "\n"
        os.pwrite(self.coll_fd, line.encode(), 0)
        # the kinds of collectives in the order this rank entered them: NCCL pairs the ranks'
        # collectives in turn, so every rank's sequence must be the same
        seq = self.record.setdefault("collective_seq", [])
        if len(seq) < MAX_COLLECTIVES:
            sites = self.record.setdefault("collective_sites", [])
            key = f"{what}\t{where or '?'}"
            if key not in self.site_index:
                self.site_index[key] = len(sites)
                # the calls that led there, to find a test on the rank around one of them
                sites.append(
                    [key]
                    + [
                        f"{f.f_code.co_filename}:{f.f_lineno}"
                        for f in self.user_frames()[::-1][:6]
                    ]
                )
            seq.append([COLLECTIVE_KINDS.get(what, what), self.site_index[key]])

    def on_ddp_forward(self, module, args, kwargs) -> None:
        import torch

        if (
            torch.is_grad_enabled()
            and module.training
            and len(self.input_prints) < MAX_STEP_PRINTS
        ):
            self.input_prints.append(V.fingerprint([*args, *kwargs.values()]))

    def on_local_grad(self, grad) -> None:
        # one entry per backward pass: the sums of the watched parameters' local gradients
        if (
            self.backward not in self.grad_prints
            and len(self.grad_prints) >= MAX_STEP_PRINTS
        ):
            return
        found = V.sums(grad)
        if found is None:
            return
        entry = self.grad_prints.setdefault(self.backward, [0.0, 0.0])
        entry[0] += found[0]
        entry[1] += found[1]

    def on_epoch_end(self, it) -> None:
        rec = it.__dict__.get("_ddpify_epoch")
        if rec is not None and not rec["complete"]:
            rec["bw_last"] = self.backward
            rec["complete"] = True
            if rec["bw_first"] is not None and rec["bw_last"] > rec["bw_first"]:
                self.train_epochs_done += 1
                self.safe("models", self.models.discover)
            elif (
                rec.get("sampler") == "DistributedSampler"
                and (rec.get("num_replicas") or 1) > 1
            ):
                # an evaluation over one shard of the data: what the script reports next, before
                # any collective, is this rank's own figure
                rec["coll_end"] = self.coll_n
                self.last_eval = rec

    def new_epoch(self, it) -> dict:
        from torch.utils.data import IterableDataset

        sampler = getattr(it, "_index_sampler", None)
        inner = getattr(sampler, "sampler", sampler)
        dataset = getattr(it, "_dataset", None)
        try:
            length = len(dataset)
        except Exception:
            length = None
        try:
            num_batches = self.iter_len(it)
        except Exception:
            num_batches = None
        distributed = type(inner).__name__ == "DistributedSampler"
        rec = {
            "num_batches": num_batches,
            "drawn": 0,
            "sampler_seed": getattr(inner, "seed", None) if distributed else None,
            "dataset": type(dataset).__qualname__,
            "dataset_len": length,
            "batch_size": getattr(sampler, "batch_size", None),
            "sampler": type(inner).__qualname__,
            "replacement": bool(getattr(inner, "replacement", False)),
            "shuffle": V.shuffles(inner),
            "sampler_epoch": getattr(inner, "epoch", None),
            "num_replicas": getattr(inner, "num_replicas", None),
            "sampler_rank": getattr(inner, "rank", None),
            "iterable": isinstance(dataset, IterableDataset),
            "indices": [],
            "fingerprints": [],
            "bw_first": None,
            "bw_last": None,
            "complete": False,
            "seq": len(self.epochs),
        }
        self.epochs.append(rec)
        return rec

    # ---------------------------------------------------------------- final dump

    def tracked_params(self) -> list:
        seen: set[int] = set()
        params = []
        groups = [
            p for opt in self.optimizers for g in opt.param_groups for p in g["params"]
        ]
        for p in [*groups, *(p for m in self.ddp_modules for p in m.parameters())]:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        return params

    def dump_params(self) -> None:
        import torch

        params = [p for p in self.tracked_params() if p.layout == torch.strided]
        if not params:
            return
        total = sum(p.numel() for p in params)
        stride = max(1, math.ceil(total / MAX_DUMP_NUMEL))
        with torch.no_grad():
            parts = [p.detach().reshape(-1)[::stride] for p in params]
            flat = torch.cat(
                [
                    (torch.view_as_real(x).reshape(-1) if x.is_complex() else x).to(
                        "cpu", torch.float64
                    )
                    for x in parts
                ]
            )
        self.in_probe = True
        try:
            torch.save(flat, self.prefix + ".params.pt")
        finally:
            self.in_probe = False
        self.record["params"] = {
            "numel": total,
            "stride": stride,
            "tensors": len(params),
        }

    def finish(
        self,
        status: str,
        exit_code: int,
        error: str | None = None,
        tb: str | None = None,
    ) -> None:
        import torch

        self.record.update(status=status, exit_code=exit_code, t_end=time.time())
        if error:
            self.record["error"] = error
            self.record["traceback"] = tb
            if (
                "did not receive grad" in error
                or "finished reduction in the prior iteration" in error
            ):
                self.record["unused_params"] = self.safe(
                    "unused_params", V.unused_params, self.ddp_modules, error
                )
        if self.last_epoch is not None and not self.last_epoch["complete"]:
            self.last_epoch["bw_last"] = self.backward

        def losses():
            self.record["losses"] = (
                [float(x) for x in torch.stack([x.float() for x in self.losses]).cpu()]
                if self.losses
                else []
            )

        self.safe("losses", losses)  # a loss on a broken device: keep going, say why
        # A crashed rank's parameters are never compared, and its device may be unusable.
        if status in ("stopped", "finished"):
            self.safe("dump_params", self.dump_params)
            self.safe("model state", self.models.at_end)
        self.safe(
            "devices",
            lambda: self.record.update(devices=V.device_info(self.tracked_params())),
        )
        self.safe(
            "imports",
            lambda: self.record.update(imports=V.imported_modules(os.environ)),
        )
        self.save_record()


def _discarded(stream: str) -> bool:
    """The stream's file descriptor goes to os.devnull (ddpify's set-up sends stdout of ranks
    other than 0 there): what is written to it is seen by no one, so it is no output."""
    fd = {"stdout": 1, "stderr": 2}.get(stream)
    if fd is None:
        return False
    try:
        st, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)
