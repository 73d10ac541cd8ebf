"""Fake-data makers of held-back split 3 (loaded by ../fakedata.py into its MAKERS).

Same contract as ../fakedata.py: each maker gets one path (relative to the script's folder, or
under the run's HOME for "~/..." specs) and writes small seeded data in the exact on-disk format
the script reads. Names start with `h3_` so that they never clash with another split's. Nothing
here is code of the corpus repositories: the formats are rebuilt from what the scripts read, and
config files are the repository's own ones (extracted next to the new file) with small settings.
"""

from __future__ import annotations

import csv
import hashlib
import json
import pickle
import random
from pathlib import Path

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _rng(path: Path, tag: str = "") -> random.Random:
    # seeded by the data set's name (not by where the tree lies), so that exports are reproducible
    return random.Random("h3:" + tag + ":" + path.parent.name + "/" + path.name)


def _image(path: Path, size: tuple[int, int], rng: random.Random, mode: str = "RGB") -> None:
    """A small noisy image (a few flat blocks plus noise) in the format the suffix names."""
    from PIL import Image

    w, h = size
    img = Image.new(mode, (w, h))
    px = img.load()
    base = [rng.randrange(256) for _ in range(3)]
    for y in range(h):
        for x in range(w):
            c = [(b + rng.randrange(-40, 41) + (60 if (x * 4 // w + y * 4 // h) % 2 else 0)) % 256 for b in base]
            px[x, y] = c[0] if mode in ("L", "P") else tuple(c[: len(mode)])
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def _edit_config(path: Path, source: str, changes: dict, fmt: str) -> None:
    """The repository's own config (SOURCE, relative to PATH's folder) copied to PATH with CHANGES
    applied ("a.b": value sets nested keys)."""
    src = path.parent / source
    if fmt == "json":
        cfg = json.loads(src.read_text())
    else:
        import yaml

        cfg = yaml.safe_load(src.read_text())
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        path.write_text(json.dumps(cfg, indent=2))
    else:
        import yaml

        path.write_text(yaml.safe_dump(cfg, default_flow_style=None, sort_keys=False))


# ----------------------------------------------------------------------------- ImageNet weights
def _resnet_shapes(depth: int, num_classes: int = 1000) -> dict[str, tuple]:
    """Parameter and buffer shapes of torchvision's ResNet-18/34/50 (the layout of the ImageNet
    checkpoints that the scripts load)."""
    layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}[depth]
    bottleneck = depth >= 50
    exp = 4 if bottleneck else 1
    shapes: dict[str, tuple] = {"conv1.weight": (64, 3, 7, 7)}

    def bn(prefix: str, n: int) -> None:
        for k in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{k}"] = (n,)
        shapes[f"{prefix}.num_batches_tracked"] = ()

    bn("bn1", 64)
    inplanes = 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers)):
        for b in range(n):
            p = f"layer{i + 1}.{b}."
            if bottleneck:
                convs = [(planes, inplanes, 1, 1), (planes, planes, 3, 3), (planes * 4, planes, 1, 1)]
            else:
                convs = [(planes, inplanes, 3, 3), (planes, planes, 3, 3)]
            for j, shape in enumerate(convs, 1):
                shapes[f"{p}conv{j}.weight"] = shape
                bn(f"{p}bn{j}", shape[0])
            stride = 2 if (b == 0 and i > 0) else 1
            if b == 0 and (stride != 1 or inplanes != planes * exp):
                shapes[f"{p}downsample.0.weight"] = (planes * exp, inplanes, 1, 1)
                bn(f"{p}downsample.1", planes * exp)
            inplanes = planes * exp
    shapes["fc.weight"] = (num_classes, 512 * exp)
    shapes["fc.bias"] = (num_classes,)
    return shapes


def _save_weights(path: Path, shapes: dict[str, tuple], seed: str) -> None:
    """A state dict whose tensors are one small slice expanded to the full shape: a tiny file whose
    values load_state_dict copies into the model's own parameters."""
    import torch

    g = torch.Generator().manual_seed(int(hashlib.md5(seed.encode()).hexdigest()[:8], 16))
    sd = {}
    for k, shape in shapes.items():
        if k.endswith("num_batches_tracked"):
            sd[k] = torch.tensor(0)
        elif len(shape) > 1:
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            sd[k] = (torch.randn(1, *shape[1:], generator=g) * (2.0 / fan_in) ** 0.5).expand(shape)
        elif k.endswith(("running_var", "weight")):
            sd[k] = torch.ones(1).expand(shape)
        else:
            sd[k] = torch.zeros(1).expand(shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)


def h3_resnet18_weights(path: Path) -> None:
    _save_weights(path, _resnet_shapes(18), "r18")


def h3_resnet34_weights(path: Path) -> None:
    _save_weights(path, _resnet_shapes(34), "r34")


def h3_resnet50_weights(path: Path) -> None:
    _save_weights(path, _resnet_shapes(50), "r50")


def h3_cifar10_small(root: Path) -> None:
    """torchvision's CIFAR-10 layout (../fakedata.py's maker) with 16 images per batch file: 80 for
    training, for models too heavy to take the usual 320 in a short CPU run."""
    import fakedata

    fakedata.cifar10(root, per_batch=16)


# ----------------------------------------------------------------------------- time series
def h3_ts_csv(path: Path, rows: int = 720, cols: int = 6) -> None:
    """A custom multivariate series: `date` (hourly), feature columns and the target `OT`."""
    import datetime
    import math

    rng = _rng(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = datetime.datetime(2020, 1, 1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["date", *[f"x{i}" for i in range(cols)], "OT"])
        for r in range(rows):
            t = start + datetime.timedelta(hours=r)
            vals = [round(math.sin(r / (5 + i)) + rng.gauss(0, 0.1), 4) for i in range(cols + 1)]
            w.writerow([t.strftime("%Y-%m-%d %H:%M:%S"), *vals])


# ----------------------------------------------------------------------------- configs
def h3_ddim_config(path: Path) -> None:
    """ddim's configs/cifar10.yml with a small UNet, 1 epoch of small batches, no worker processes."""
    _edit_config(path, "cifar10.yml", {
        "data.num_workers": 0, "model.ch": 16, "model.ch_mult": [1, 2], "model.num_res_blocks": 1,
        "model.attn_resolutions": [16], "diffusion.num_diffusion_timesteps": 100,
        "training.batch_size": 16, "training.n_epochs": 1, "training.snapshot_freq": 10,
        "training.validation_freq": 1000, "sampling.batch_size": 4}, "yaml")


def h3_ddpm_config(path: Path) -> None:
    """DDPM-Pytorch's config/default.yaml with a small UNet, 1 epoch over the fake images."""
    _edit_config(path, "../config/default.yaml", {
        "dataset_params.im_path": "data/train/images", "diffusion_params.num_timesteps": 100,
        "model_params.down_channels": [8, 16, 16, 16], "model_params.mid_channels": [16, 16, 16],
        "model_params.time_emb_dim": 16, "model_params.num_down_layers": 1, "model_params.num_mid_layers": 1,
        "model_params.num_up_layers": 1, "model_params.num_heads": 2,
        "train_params.task_name": "h3_run", "train_params.batch_size": 16, "train_params.num_epochs": 2}, "yaml")


def h3_seg_config(path: Path) -> None:
    """pytorch-segmentation's config.json on the fake VOC folders: PSPNet with a ResNet-18 backbone
    (ImageNet weights from the hub cache), differential learning rates as shipped, 2 epochs."""
    loader = {"data_dir": "data/voc", "batch_size": 4, "base_size": 64, "crop_size": 64, "augment": True,
              "shuffle": True, "scale": True, "flip": True, "rotate": False, "blur": False, "split": "train",
              "num_workers": 0}
    val = {"data_dir": "data/voc", "batch_size": 4, "crop_size": 64, "val": True, "split": "val", "num_workers": 0}
    _edit_config(path, "config.json", {
        "name": "h3_pspnet", "n_gpu": 1, "arch.type": "PSPNet",
        "arch.args": {"backbone": "resnet18", "freeze_bn": False, "freeze_backbone": False, "use_aux": True},
        "train_loader.type": "VOC", "train_loader.args": loader, "val_loader.type": "VOC", "val_loader.args": val,
        "trainer.epochs": 2, "trainer.save_period": 1, "trainer.early_stop": 10, "trainer.log_per_iter": 1,
        "trainer.val_per_epochs": 1}, "json")


# ----------------------------------------------------------------------------- image data sets
def h3_flowers_split(root: Path, classes: int = 5, n_train: int = 4, n_val: int = 1) -> None:
    """ImageFolder layout split in two: ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg."""
    names = ["daisy", "dandelion", "roses", "sunflowers", "tulips"][:classes]
    rng = _rng(root)
    for split, n in (("train", n_train), ("val", n_val)):
        for c in names:
            for i in range(n):
                _image(root / split / c / f"{c}_{i}.jpg", (48, 40), rng)


def h3_flowers_photos(root: Path, classes: int = 5, n: int = 5) -> None:
    """The flower_photos archive's layout: ROOT/<class>/*.jpg (the script splits it itself)."""
    names = ["daisy", "dandelion", "roses", "sunflowers", "tulips"][:classes]
    rng = _rng(root)
    for c in names:
        for i in range(n):
            _image(root / c / f"{c}_{i}.jpg", (48, 40), rng)


def h3_mnist_png(root: Path, per_class: int = 6) -> None:
    """MNIST exported to PNG folders: ROOT/<digit>/<n>.png, 28x28 grayscale."""
    rng = _rng(root)
    for d in range(10):
        for i in range(per_class):
            _image(root / str(d) / f"{i}.png", (28, 28), rng, mode="L")


def h3_unaligned(root: Path, n: int = 6) -> None:
    """Unpaired image-to-image folders: ROOT/trainA/*.jpg, ROOT/trainB/*.jpg (and testA/testB)."""
    rng = _rng(root)
    for sub, k in (("trainA", n), ("trainB", n + 1), ("testA", 2), ("testB", 2)):
        for i in range(k):
            _image(root / sub / f"{i}.jpg", (72, 72), rng)


def h3_voc(root: Path, n_train: int = 8, n_val: int = 4) -> None:
    """Pascal VOC 2012 segmentation layout: VOCdevkit/VOC2012/{JPEGImages,SegmentationClass,
    ImageSets/Segmentation/{train,val}.txt}; labels are palette PNGs with classes 0..20 and 255."""
    from PIL import Image

    rng = _rng(root)
    base = root / "VOCdevkit" / "VOC2012"
    (base / "ImageSets" / "Segmentation").mkdir(parents=True, exist_ok=True)
    (base / "SegmentationClass").mkdir(parents=True, exist_ok=True)
    palette = [v for i in range(256) for v in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]
    for split, n in (("train", n_train), ("val", n_val)):
        ids = [f"2012_{split}_{i:04d}" for i in range(n)]
        (base / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
        for name in ids:
            _image(base / "JPEGImages" / f"{name}.jpg", (80, 72), rng)
            lab = Image.new("P", (80, 72))
            lab.putpalette(palette)
            px = lab.load()
            cls = [0, rng.randrange(1, 21), rng.randrange(1, 21)]
            for y in range(72):
                for x in range(80):
                    px[x, y] = 255 if (x in (39, 40)) else cls[(x // 27 + y // 36) % 3]
            lab.save(base / "SegmentationClass" / f"{name}.png")


def h3_market1501(root: Path, ids: int = 6, per_id: int = 4) -> None:
    """Market-1501 as torchreid reads it: ROOT/market1501/Market-1501-v15.09.15/{bounding_box_train,
    query,bounding_box_test}/<pid>_c<cam>s1_<frame>_00.jpg (query and gallery share identities; 24 gallery images: the CMC curve reports rank 20)."""
    rng = _rng(root)
    base = root / "market1501" / "Market-1501-v15.09.15"
    for sub, pids, k in (("bounding_box_train", range(1, ids + 1), per_id),
                         ("query", range(100, 104), 1), ("bounding_box_test", range(100, 104), 6)):
        for pid in pids:
            for i in range(k):
                cam = 1 + (i % 3) if sub != "query" else 6
                _image(base / sub / f"{pid:04d}_c{cam}s1_{i * 25:06d}_00.jpg", (32, 64), rng)


def h3_reid_folders(root: Path, ids: int = 8, per_id: int = 5) -> None:
    """Market-1501 after the re-ID baseline's prepare.py: ROOT/{train,val,train_all}/<pid>/*.jpg
    (one image of each identity in val; train_all holds all of them)."""
    rng = _rng(root)
    for pid in range(1, ids + 1):
        for i in range(per_id):
            name = f"{pid:04d}_c{1 + i % 6}s1_{i * 25:06d}_00.jpg"
            sub = "val" if i == 0 else "train"
            _image(root / sub / f"{pid:04d}" / name, (32, 64), rng)
            _image(root / "train_all" / f"{pid:04d}" / name, (32, 64), rng)


def h3_captcha(root: Path, n: int = 40, length: int = 5) -> None:
    """Captcha images named by their text: ROOT/<text>.png."""
    rng = _rng(root)
    alphabet = "2345678bcdefgmnpwxy"
    seen = set()
    while len(seen) < n:
        text = "".join(rng.choice(alphabet) for _ in range(length))
        if text in seen:
            continue
        seen.add(text)
        _image(root / f"{text}.png", (100, 25), rng, mode="RGBA")


# ----------------------------------------------------------------------------- text, graphs
def h3_word_emb(path: Path, dim: int = 50) -> None:
    """Word embeddings as text: "word v1 ... vD" per line, for the words of the tagged sample files
    next to PATH (and a few more)."""
    rng = _rng(path)
    words = {"the", "of", "and", "in", "to"}
    for f in path.parent.glob("*.bmes"):
        for line in f.read_text(errors="replace").splitlines():
            parts = line.split()
            if parts:
                words.add(parts[0])
    path.write_text("".join(w + " " + " ".join(f"{rng.uniform(-1, 1):.4f}" for _ in range(dim)) + "\n"
                            for w in sorted(words)))


def h3_planetoid(root: Path, name: str = "cora", n_feat: int = 32, n_cls: int = 7, n_train: int = 35,
                 n_all: int = 640, n_test: int = 100) -> None:
    """Planetoid raw files (Kipf's format): ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index};
    x/tx/allx pickled scipy CSR matrices, y/ty/ally one-hot numpy arrays, graph a dict of lists."""
    import numpy as np
    import scipy.sparse as sp

    rng = _rng(root)
    raw = root
    raw.mkdir(parents=True, exist_ok=True)
    n = n_all + n_test

    def feats(k):
        return sp.csr_matrix(np.array([[1.0 if rng.random() < 0.1 else 0.0 for _ in range(n_feat)] for _ in range(k)],
                                      dtype=np.float32))

    def onehot(k):
        y = np.zeros((k, n_cls), dtype=np.int32)
        for i in range(k):
            y[i, rng.randrange(n_cls)] = 1
        return y

    objs = {"x": feats(n_train), "tx": feats(n_test), "allx": feats(n_all), "y": onehot(n_train),
            "ty": onehot(n_test), "ally": onehot(n_all)}
    objs["graph"] = {i: sorted({rng.randrange(n) for _ in range(3)} - {i}) for i in range(n)}
    for k, v in objs.items():
        with open(raw / f"ind.{name}.{k}", "wb") as f:
            pickle.dump(v, f, protocol=2)
    idx = list(range(n_all, n))
    rng.shuffle(idx)
    (raw / f"ind.{name}.test.index").write_text("\n".join(map(str, idx)) + "\n")


def h3_tu_dataset(raw: Path, graphs: int = 60) -> None:
    """A TU graph-classification data set (MUTAG's files): <NAME>_{A,graph_indicator,graph_labels,
    node_labels,edge_labels}.txt, nodes numbered from 1 across graphs; NAME is RAW's parent folder."""
    rng = _rng(raw)
    name = raw.parent.name
    raw.mkdir(parents=True, exist_ok=True)
    edges, indicator, node_labels, edge_labels, graph_labels = [], [], [], [], []
    node = 1
    for g in range(1, graphs + 1):
        k = rng.randrange(8, 16)
        ids = list(range(node, node + k))
        for i in range(1, k):  # a random tree plus a few chords, both directions
            j = rng.randrange(0, i)
            for a, b in ((ids[i], ids[j]), (ids[j], ids[i])):
                edges.append(f"{a}, {b}")
                edge_labels.append(str(rng.randrange(4)))
        indicator += [str(g)] * k
        node_labels += [str(rng.randrange(7)) for _ in range(k)]
        graph_labels.append(rng.choice(["1", "-1"]))
        node += k
    for suffix, rows in (("A", edges), ("graph_indicator", indicator), ("node_labels", node_labels),
                         ("edge_labels", edge_labels), ("graph_labels", graph_labels)):
        (raw / f"{name}_{suffix}.txt").write_text("\n".join(rows) + "\n")


MAKERS = {
    "h3_resnet18_weights": h3_resnet18_weights,
    "h3_resnet34_weights": h3_resnet34_weights,
    "h3_resnet50_weights": h3_resnet50_weights,
    "h3_cifar10_small": h3_cifar10_small,
    "h3_ts_csv": h3_ts_csv,
    "h3_ddim_config": h3_ddim_config,
    "h3_ddpm_config": h3_ddpm_config,
    "h3_seg_config": h3_seg_config,
    "h3_flowers_split": h3_flowers_split,
    "h3_flowers_photos": h3_flowers_photos,
    "h3_mnist_png": h3_mnist_png,
    "h3_unaligned": h3_unaligned,
    "h3_voc": h3_voc,
    "h3_market1501": h3_market1501,
    "h3_reid_folders": h3_reid_folders,
    "h3_captcha": h3_captcha,
    "h3_word_emb": h3_word_emb,
    "h3_planetoid": h3_planetoid,
    "h3_tu_dataset": h3_tu_dataset,
}
