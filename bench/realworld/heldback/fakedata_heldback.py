"""Fake-data makers of the held-back split (loaded by ../fakedata.py into its MAKERS).

Same contract as fakedata.py: each maker gets one path (relative to the script's folder, or under
the run's HOME for "~/..." specs) and writes small seeded data in the exact on-disk format the
script reads. Names start with `h2_` so that they never clash with another split's. Nothing here
is code of the corpus repositories: the formats are rebuilt from what the scripts read.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import pickle
import random
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the worktree: .realworld_deps/tv holds torchvision's Python parts

# Common CJK characters (a small "vocabulary" for the Chinese text entries) and a few English words.
CJK = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产"
       "种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业"
       "本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利"
       "比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文")
WORDS = "stock market team game school movie police city price house phone music".split()


def _rng(path: Path, tag: str = "") -> random.Random:
    # seeded by the data set's name (not by where the tree lies), so that exports are reproducible
    return random.Random("h2:" + tag + ":" + path.name)


def _image(path: Path, size: tuple[int, int], mode: str = "RGB", levels: int = 256, seed: str = "") -> None:
    from PIL import Image

    rng = random.Random("h2img:" + seed + str(path.name) + str(path.parent.name))
    path.parent.mkdir(parents=True, exist_ok=True)
    channels = 1 if mode in ("L", "P") else len(mode)
    step = 256 // levels
    data = bytes(rng.randrange(levels) * step for _ in range(size[0] * size[1] * channels))
    Image.frombytes(mode, size, data).save(path)


def _idx(path: Path, magic: int, dims: list[int], data: bytes, gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims)
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(head + data)


# ----------------------------------------------------------------------------- images / folders
def folder_of_images(root: Path, classes: list[str], per_class: int, size: int, ext: str = "jpg") -> None:
    for c in classes:
        for i in range(per_class):
            _image(root / c / f"{i}.{ext}", (size, size), seed=c)


def food3(root: Path) -> None:
    """The going_modular course's layout: ROOT/{train,test}/{pizza,steak,sushi}/*.jpg."""
    for split, n in (("train", 12), ("test", 4)):
        folder_of_images(root / split, ["pizza", "steak", "sushi"], n, 64)


def faces(root: Path) -> None:
    """An ImageFolder root with one folder of 96x96 face-like images (AnimeGAN's data/faces/)."""
    folder_of_images(root, ["faces"], 32, 96)


def dogcat(root: Path) -> None:
    """The dogs-vs-cats layout: ROOT/train/{cat,dog}.N.jpg (flat, label in the name), ROOT/test/N.jpg."""
    for i in range(12):
        for kind in ("cat", "dog"):
            _image(root / "train" / f"{kind}.{i}.jpg", (64, 64), seed=kind)
    for i in range(1, 5):
        _image(root / "test" / f"{i}.jpg", (64, 64))


def celeba_folder(root: Path) -> None:
    """An ImageFolder of CelebA-like 64x64 faces (ROOT/img_align_celeba/*.jpg)."""
    folder_of_images(root, ["img_align_celeba"], 64, 64)


def cub200(root: Path) -> None:
    """CUB-200-2011's image layout: ROOT/images/NNN.Name/*.jpg for 200 classes (the metric-learning
    scripts train on classes 0-99 and evaluate on 100-199)."""
    classes = [f"{i + 1:03d}.Bird_{i + 1}" for i in range(200)]
    folder_of_images(root / "images", classes, 2, 32)


def voc2012(root: Path, n_train: int = 8, n_val: int = 4, size: int = 64) -> None:
    """Pascal VOC 2012 segmentation layout under ROOT/VOCdevkit/VOC2012: JPEGImages/*.jpg,
    SegmentationClass/*.png (palette images, classes 0-20 and 255 borders), ImageSets/Segmentation/{train,val}.txt."""
    from PIL import Image

    voc = root / "VOCdevkit" / "VOC2012"
    rng = _rng(root, "voc")
    names = {"train": [f"2007_{i:06d}" for i in range(n_train)],
             "val": [f"2008_{i:06d}" for i in range(n_val)]}
    palette = []
    for i in range(256):
        palette += [(i * 37) % 256, (i * 91) % 256, (i * 53) % 256]
    for split, ids in names.items():
        (voc / "ImageSets" / "Segmentation").mkdir(parents=True, exist_ok=True)
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
        for name in ids:
            _image(voc / "JPEGImages" / f"{name}.jpg", (size, size))
            mask = bytes(rng.choice([0, 0, 0, rng.randrange(1, 21), 255]) for _ in range(size * size))
            img = Image.frombytes("P", (size, size), mask)
            img.putpalette(palette)
            (voc / "SegmentationClass").mkdir(parents=True, exist_ok=True)
            img.save(voc / "SegmentationClass" / f"{name}.png")


# ----------------------------------------------------------------------------- array data sets
def cifar100(root: Path, n_train: int = 256, n_test: int = 64) -> None:
    """torchvision's CIFAR-100 layout: ROOT/cifar-100-python/{train,test,meta} (python pickles)."""
    import numpy as np

    rs = np.random.RandomState(100)
    d = root / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        entry = {"data": rs.randint(0, 256, (n, 3072)).astype(np.uint8), "fine_labels": [i % 100 for i in range(n)],
                 "coarse_labels": [i % 20 for i in range(n)], "filenames": [f"{i}.png" for i in range(n)],
                 "batch_label": name}
        with open(d / name, "wb") as f:
            pickle.dump(entry, f)
    with open(d / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)],
                     "coarse_label_names": [f"s{i}" for i in range(20)]}, f)


def dsprites(path: Path, n: int = 512) -> None:
    """dSprites' npz (key `imgs`: uint8 0/1 images, N x 64 x 64), small random squares."""
    import numpy as np

    rs = np.random.RandomState(7)
    imgs = np.zeros((n, 64, 64), dtype=np.uint8)
    for i in range(n):
        x, y, s = rs.randint(0, 48), rs.randint(0, 48), rs.randint(4, 16)
        imgs[i, y:y + s, x:x + s] = 1
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, imgs=imgs, latents_classes=np.zeros((n, 6), dtype=np.int64))


def mnist_gz(root: Path) -> None:
    """The four MNIST .gz idx files in ROOT, with the full 60000/10000 counts (the tutorial
    reshapes to exactly that many); images almost empty so that the files stay small."""
    for prefix, n in (("train", 60000), ("t10k", 10000)):
        img = bytearray(n * 784)
        for i in range(n):
            c = i % 10
            for k in range(3):  # a few pixels that depend on the class
                img[i * 784 + 300 + 28 * k + c] = 255
        _idx(root / f"{prefix}-images-idx3-ubyte.gz", 0x803, [n, 28, 28], bytes(img), gz=True)
        _idx(root / f"{prefix}-labels-idx1-ubyte.gz", 0x801, [n], bytes(i % 10 for i in range(n)), gz=True)


def vdsr_h5(path: Path, n: int = 64, patch: int = 41) -> None:
    """VDSR's training h5: datasets `data` (blurred input) and `label`, (N, 1, patch, patch) floats in 0-1."""
    import h5py
    import numpy as np

    rs = np.random.RandomState(3)
    label = rs.rand(n, 1, patch, patch).astype(np.float32)
    data = np.clip(label + rs.randn(n, 1, patch, patch).astype(np.float32) * 0.05, 0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data)
        f.create_dataset("label", data=label)


def ett_csv(path: Path, n: int = 700) -> None:
    """An ETT-like hourly multivariate csv: date, six load columns and the target OT."""
    import math

    rng = _rng(path, "ett")
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["date", *cols])
        for t in range(n):
            day, hour = divmod(t, 24)
            date = f"2016-{7 + day // 28:02d}-{1 + day % 28:02d} {hour:02d}:00:00"
            w.writerow([date, *(f"{math.sin(t / (6 + k)) * (k + 1) + rng.gauss(0, 0.1):.3f}" for k in range(7))])


def mutag(path: Path, n_graphs: int = 60) -> None:
    """The GIN repository's graph text format (dataset/NAME/NAME.txt): the graph count, then per graph
    "n_nodes label", then per node "tag n_neighbours neighbour...". Ring-like graphs, 2 classes."""
    rng = _rng(path, "mutag")
    lines = [str(n_graphs)]
    for g in range(n_graphs):
        n = rng.randint(6, 14)
        label = g % 2
        adj = {i: set() for i in range(n)}
        for i in range(n):
            j = (i + 1) % n
            adj[i].add(j)
            adj[j].add(i)
        for _ in range(n // 3 + label * 2):
            a, b = rng.randrange(n), rng.randrange(n)
            if a != b:
                adj[a].add(b)
                adj[b].add(a)
        lines.append(f"{n} {label}")
        for i in range(n):
            nb = sorted(adj[i])
            lines.append(" ".join(str(x) for x in [rng.randrange(3), len(nb), *nb]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- text
def _cjk_sentence(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(CJK) for _ in range(rng.randint(lo, hi)))


def thucnews(root: Path) -> None:
    """THUCNews' layout as the text-classification scripts read it: ROOT/{train,dev,test}.txt, one
    "text<TAB>label" a line (labels 0-9, class.txt comes with the repository)."""
    for split, n in (("train", 256), ("dev", 128), ("test", 128)):  # >= one batch of 128 (hard-coded)
        rng = _rng(root, split)
        lines = []
        for i in range(n):
            label = i % 10
            # a class-dependent character makes the labels learnable
            text = CJK[label * 7] + _cjk_sentence(rng, 8, 28) + CJK[label * 7 + 1]
            lines.append(f"{text}\t{label}")
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def tang_npz(path: Path, n: int = 96, maxlen: int = 125) -> None:
    """The poetry chapter's preprocessed tang.npz: `data` (N x maxlen ints, poems padded in front with
    the pad word), `word2ix` and `ix2word` dicts; <START>/<EOP> around each poem, '</s>' the pad
    word and the last index (the script takes len(word2ix) - 1 as the padding index)."""
    import numpy as np

    rng = _rng(path, "tang")
    words = list(dict.fromkeys(CJK + "，。")) + ["<EOP>", "<START>", "</s>"]
    word2ix = {w: i for i, w in enumerate(words)}
    ix2word = {i: w for w, i in word2ix.items()}
    data = np.full((n, maxlen), word2ix["</s>"], dtype=np.int32)
    for i in range(n):
        poem = ["<START>"] + [rng.choice(CJK) if k % 6 != 5 else "，" for k in range(rng.randint(20, 60))] + ["<EOP>"]
        ids = [word2ix[w] for w in poem][:maxlen]
        data[i, maxlen - len(ids):] = ids
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, data=data, word2ix=np.array(word2ix, dtype=object), ix2word=np.array(ix2word, dtype=object))


def gpt2_corpus(path: Path, n: int = 40) -> None:
    """GPT2-Chinese's raw corpus: a JSON list of articles (strings), each long enough for min_length."""
    rng = _rng(path, "gpt2")
    arts = ["，".join(_cjk_sentence(rng, 6, 14) for _ in range(rng.randint(12, 20))) + "。" for _ in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(arts, ensure_ascii=False), encoding="utf-8")


def gpt2_config(path: Path) -> None:
    """A small GPT-2 model config, in the format of GPT2-Chinese's config/model_config*.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "n_ctx": 64, "n_embd": 32,
                                "n_head": 2, "n_layer": 2, "n_positions": 64, "vocab_size": 13317}, indent=2))


# ----------------------------------------------------------------------------- configs (the user's own)
def _yaml(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


_SSL_YAML = """name: {name}
dataset:
  name: cifar10
  image_size: 32
  num_workers: 0

model:
  name: {model}
  backbone: resnet18_cifar_variant1
{extra_model}
train:
  optimizer:
    name: {opt}
    weight_decay: 0.0005
    momentum: 0.9
  warmup_epochs: 0
  warmup_lr: 0
  base_lr: 0.03
  final_lr: 0
  num_epochs: 2
  stop_at_epoch: 1
  batch_size: 16
  knn_monitor: False
  knn_interval: 1
  knn_k: 20
eval: False

logger:
  tensorboard: True
  matplotlib: True

seed: null
"""


def simsiam_config(path: Path) -> None:
    """A small-run SimSiam config in the format of the repository's configs/simsiam_cifar.yaml."""
    _yaml(path, _SSL_YAML.format(name="h2-simsiam", model="simsiam", extra_model="  proj_layers: 2\n", opt="sgd"))


def simclr_config(path: Path) -> None:
    """A small-run SimCLR config (configs/simclr_cifar.yaml's format: LARS optimizer)."""
    _yaml(path, _SSL_YAML.format(name="h2-simclr", model="simclr", extra_model="", opt="lars_simclr"))


# ----------------------------------------------------------------------------- weights and checkpoints
_TV_CACHE = {  # torch hub cache file -> torchvision model builder
    "resnet18-f37072fd.pth": "resnet18",
    "resnet18-5c106cde.pth": "resnet18",
    "mobilenet_v2-b0353104.pth": "mobilenet_v2",
    "squeezenet1_1-b8a52dc0.pth": "squeezenet1_1",
    "squeezenet1_1-f364aa15.pth": "squeezenet1_1",
    "vgg16-397923af.pth": "vgg16",
}

_EXPAND = """
import sys, torch
g = torch.Generator().manual_seed(0)
def expanded(sd):
    # every weight stored as one small slice expanded to its full shape: a tiny file whose values
    # load_state_dict copies into the model's own parameters
    out = {}
    for k, v in sd.items():
        if v.dim() >= 2:
            fan_in = v[0].numel()
            out[k] = (torch.randn(1, *v.shape[1:], generator=g) * (2.0 / fan_in) ** 0.5).expand(v.shape)
        elif k.endswith(("running_var", "weight")) and v.dim() == 1:
            out[k] = torch.ones(1).expand(v.shape)
        else:
            out[k] = torch.zeros_like(v)
    return out
"""


def _run_py(code: str, cwd: Path, extra_path: list[Path]) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), env.get("PYTHONPATH", "")])
    env["RW_TV_NO_OPS"] = "1"
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True, capture_output=True)


def tv_weights(path: Path) -> None:
    """A torch hub cache file (~/.cache/torch/hub/checkpoints/NAME) for torchvision's ImageNet
    weights, so that `pretrained=True` finds it and downloads nothing: torchvision's own
    architecture (its Python parts, as the harness installs them), random values, tiny file."""
    path = path.resolve()  # the child process runs elsewhere
    arch = _TV_CACHE[path.name]
    deps = ROOT / ".realworld_deps"
    path.parent.mkdir(parents=True, exist_ok=True)
    code = _EXPAND + (f"import torchvision\nm = torchvision.models.{arch}()\n"
                      f"torch.save(expanded(m.state_dict()), {str(path)!r})\n")
    _run_py(code, path.parent, [ROOT / "bench" / "realworld" / "shim", deps / "tv", *sorted(deps.glob("site*"))])


def mdistiller_teacher(path: Path) -> None:
    """A CIFAR-100 teacher checkpoint ({'model': state_dict}) where mdistiller looks for it
    (download_ckpts/cifar_teachers/<name>_vanilla/ckpt_epoch_240.pth): the repository's own CIFAR
    ResNet class, built from its file in a child process, random values."""
    path = path.resolve()  # the child process runs elsewhere
    root = path.parents[3]
    name = path.parent.name.split("_")[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    code = _EXPAND + (f"import resnet\nm = resnet.{name}(num_classes=100)\n"
                      f"torch.save({{'model': expanded(m.state_dict()), 'epoch': 240}}, {str(path)!r})\n")
    _run_py(code, root, [root / "mdistiller" / "models" / "cifar"])


def pixelsnail_lmdb(path: Path, n: int = 24) -> None:
    """vq-vae-2's extract_code.py output: an LMDB of pickled CodeRow(top, bottom, filename) namedtuples
    (top 32x32 and bottom 64x64 int64 codes < 512) and a `length` key. The namedtuple is pickled
    under the module name `dataset`, as the repository's script writes it."""
    import collections
    import types

    import lmdb
    import numpy as np

    mod = types.ModuleType("dataset")
    row_cls = collections.namedtuple("CodeRow", ["top", "bottom", "filename"])
    row_cls.__module__ = "dataset"
    mod.CodeRow = row_cls
    saved = sys.modules.get("dataset")
    sys.modules["dataset"] = mod
    try:
        rs = np.random.RandomState(5)
        path.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(str(path), map_size=64 * 1024 * 1024)
        with env.begin(write=True) as txn:
            for i in range(n):
                row = row_cls(top=rs.randint(0, 512, (32, 32)).astype(np.int64),
                              bottom=rs.randint(0, 512, (64, 64)).astype(np.int64), filename=f"class0/{i}.png")
                txn.put(str(i).encode("utf-8"), pickle.dumps(row))
            txn.put(b"length", str(n).encode("utf-8"))
        env.close()
    finally:
        if saved is None:
            sys.modules.pop("dataset", None)
        else:
            sys.modules["dataset"] = saved


MAKERS = {
    "h2_food3": food3,
    "h2_faces": faces,
    "h2_dogcat": dogcat,
    "h2_celeba_folder": celeba_folder,
    "h2_cub200": cub200,
    "h2_voc2012": voc2012,
    "h2_cifar100": cifar100,
    "h2_dsprites": dsprites,
    "h2_mnist_gz": mnist_gz,
    "h2_vdsr_h5": vdsr_h5,
    "h2_ett_csv": ett_csv,
    "h2_mutag": mutag,
    "h2_thucnews": thucnews,
    "h2_tang_npz": tang_npz,
    "h2_gpt2_corpus": gpt2_corpus,
    "h2_gpt2_config": gpt2_config,
    "h2_simsiam_config": simsiam_config,
    "h2_simclr_config": simclr_config,
    "h2_tv_weights": tv_weights,
    "h2_mdistiller_teacher": mdistiller_teacher,
    "h2_pixelsnail_lmdb": pixelsnail_lmdb,
}
