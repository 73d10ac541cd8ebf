"""Small synthetic data sets in the exact on-disk formats that the corpus scripts read.

Each maker writes under a path relative to the script's working directory, so that the script
finds its data where it looks and torchvision's `download=True` sees the files and skips the
download. The data is random (seeded), small, and only has to have the right shapes and types.
Spec in the manifest: "MAKER:PATH" (PATH relative to the script's directory).
"""

from __future__ import annotations

import os
import pickle
import random
import struct
from pathlib import Path

WORDS = (
    "the king and queen of a small town went to sea with their men and came back to the "
    "house where all the people were waiting for news of the war that was lost at night"
).split()
NAMES = ["anna", "bob", "carla", "dmitri", "emma", "felix", "greta", "hugo", "ines", "jan",
         "karl", "lena", "marco", "nina", "oskar", "paula", "quinn", "rosa", "sven", "tara"]


def _rng(path: Path) -> random.Random:
    """Seeded by the last two parts of the path, not by where the tree is: the same data set made for
    two entries has the same bytes, which --export stores once."""
    return random.Random("/".join(Path(path).parts[-2:]))


def _idx(path: Path, magic: int, dims: list[int], data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(data)


def mnist(root: Path, n_train: int = 600, n_test: int = 100, cls: str = "MNIST") -> None:
    """torchvision's MNIST layout: ROOT/MNIST/raw/*-ubyte (idx files, no .gz). 600 = 3 full batches
    of 100 on each of 2 ranks (some tutorials reshape with a fixed batch size)."""
    rng = random.Random(f"mnist:{cls}:{n_train}:{n_test}")
    raw = root / cls / "raw"
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = bytes(i % 10 for i in range(n))
        images = bytes(rng.randrange(256) if rng.random() < 0.3 else 0 for _ in range(n * 28 * 28))
        _idx(raw / f"{prefix}-images-idx3-ubyte", 0x803, [n, 28, 28], images)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", 0x801, [n], labels)


def fashion_mnist(root: Path) -> None:
    mnist(root, cls="FashionMNIST")


def cifar10(root: Path, per_batch: int = 64) -> None:
    """torchvision's CIFAR-10 layout: ROOT/cifar-10-batches-py/ python pickles (md5 is not checked:
    the harness shim skips it)."""
    rng = random.Random(f"cifar10:{per_batch}")
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    import numpy as np

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = np.frombuffer(bytes(rng.randrange(256) for _ in range(per_batch * 3072)), dtype=np.uint8)
        entry = {"batch_label": name, "labels": [i % 10 for i in range(per_batch)],
                 "data": data.reshape(per_batch, 3072), "filenames": [f"{i}.png" for i in range(per_batch)]}
        with open(d / name, "wb") as f:
            pickle.dump(entry, f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": per_batch, "num_vis": 3072}, f)


def text(path: Path, n_words: int = 6000) -> None:
    """A plain-text corpus (input.txt of char-level models): lines of words."""
    rng = _rng(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Every letter and the usual punctuation, so that sampling prompts in the scripts
    # ("O God, O God!") map into the vocabulary.
    lines = ["ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz 0123456789 .,;:!?'-&$"]
    while n_words > 0:
        k = rng.randint(4, 12)
        lines.append((" ".join(rng.choice(WORDS) for _ in range(k))).capitalize() + ".")
        n_words -= k
    path.write_text("\n".join(lines) + "\n")


def wikitext(root: Path) -> None:
    """word_language_model's layout: ROOT/{train,valid,test}.txt."""
    for split, n in (("train", 4000), ("valid", 600), ("test", 600)):
        text(root / f"{split}.txt", n)


def names(path: Path) -> None:
    """One name a line (makemore's names.txt)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = _rng(path)
    out = [n + rng.choice(["", "a", "o", "ie", "son"]) for n in NAMES for _ in range(10)]
    path.write_text("\n".join(out) + "\n")


def names_dir(root: Path) -> None:
    """char-rnn classification: ROOT/<Language>.txt, one name a line."""
    root.mkdir(parents=True, exist_ok=True)
    for lang in ("English", "French", "German", "Italian"):
        names(root / f"{lang}.txt")


def cora(root: Path, n_nodes: int = 2708, n_feat: int = 64, n_edges: int = 5429) -> None:
    """The Cora layout: cora.content (id, 0/1 features, label) and cora.cites (id id)."""
    rng = _rng(root)
    root.mkdir(parents=True, exist_ok=True)
    classes = ["Case_Based", "Genetic_Algorithms", "Neural_Networks", "Probabilistic_Methods",
               "Reinforcement_Learning", "Rule_Learning", "Theory"]
    ids = [1000 + 7 * i for i in range(n_nodes)]
    with open(root / "cora.content", "w") as f:
        for i, node in enumerate(ids):
            feats = ["1" if rng.random() < 0.1 else "0" for _ in range(n_feat)]
            feats[i % n_feat] = "1"  # no empty rows (row-normalisation divides by the sum)
            f.write("\t".join([str(node), *feats, classes[i % len(classes)]]) + "\n")
    with open(root / "cora.cites", "w") as f:
        for _ in range(n_edges):
            f.write(f"{rng.choice(ids)}\t{rng.choice(ids)}\n")


def _image(path: Path, size: tuple[int, int], mode: str = "RGB", levels: int = 256) -> None:
    from PIL import Image

    rng = _rng(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    channels = len(mode) if mode != "L" else 1
    step = 256 // levels
    data = bytes(rng.randrange(levels) * step for _ in range(size[0] * size[1] * channels))
    Image.frombytes(mode, size, data).save(path)


def image_folder(root: Path, n_per_class: int = 8, size: int = 32) -> None:
    """ImageFolder layout: ROOT/<class>/<n>.jpg."""
    for c in ("cat", "dog"):
        for i in range(n_per_class):
            _image(root / c / f"{i}.jpg", (size, size))


def bsds300(root: Path) -> None:
    """super_resolution's layout after its download: ROOT/BSDS300/images/{train,test}/*.jpg."""
    for split, n in (("train", 6), ("test", 2)):
        for i in range(n):
            _image(root / "BSDS300" / "images" / split / f"{i}.jpg", (300, 300))


def carvana(root: Path, n: int = 10, size: int = 64) -> None:
    """Pytorch-UNet's layout: ROOT/imgs/<id>.jpg and ROOT/masks/<id>_mask.png (values 0/255)."""
    for i in range(n):
        _image(root / "imgs" / f"car{i}.jpg", (size, size))
        _image(root / "masks" / f"car{i}_mask.png", (size, size), mode="L", levels=2)


def facades(root: Path) -> None:
    """pix2pix's layout: ROOT/{train,val,test}/*.jpg, A and B side by side (512x256)."""
    for split, n in (("train", 4), ("val", 2), ("test", 1)):
        for i in range(n):
            _image(root / split / f"{i}.jpg", (512, 256))


def sine(path: Path, n: int = 20, length: int = 200) -> None:
    """time_sequence_prediction's traindata.pt: a float64 numpy array of sine waves (N, L), as
    its generate_sine_wave.py saves it."""
    import math

    import numpy as np
    import torch

    rng = _rng(path)
    rows = []
    for _ in range(n):
        shift = rng.randrange(-80, 80)
        rows.append([math.sin((i + shift) / 20.0) for i in range(length)])
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(np.array(rows, dtype="float64"), open(path, "wb"))


def stl10(root: Path) -> None:
    """torchvision's STL10 layout: ROOT/stl10_binary/{train,test,unlabeled}_X.bin (uint8, N x 3 x 96
    x 96, column-major images), {train,test}_y.bin (labels 1..10), class_names.txt, fold_indices.txt.
    80 train+unlabeled images: SimCLR's 5% validation split must hold a whole batch of 4."""
    import numpy as np

    d = root / "stl10_binary"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("test", 8), ("unlabeled", 40)):
        rng.integers(0, 256, size=(n, 3, 96, 96), dtype=np.uint8).tofile(d / f"{split}_X.bin")
        if split != "unlabeled":
            (np.arange(n) % 10 + 1).astype(np.uint8).tofile(d / f"{split}_y.bin")
    (d / "class_names.txt").write_text("\n".join(["airplane", "bird", "car", "cat", "deer", "dog", "horse",
                                                  "monkey", "ship", "truck"]) + "\n")
    (d / "fold_indices.txt").write_text("\n".join(" ".join(str(i) for i in range(k, n, 10)) for k in range(10)) + "\n")


def sr_image_list(root: Path, n: int = 8, size: int = 128) -> None:
    """a-PyTorch-Tutorial-to-Super-Resolution's layout after create_data_lists.py: ROOT/train_images.json
    (a JSON list of image paths, here relative to the script's folder) and the images (>= 96 px)."""
    paths = []
    for i in range(n):
        _image(root / "sr_images" / f"{i}.jpg", (size, size))
        paths.append(f"sr_images/{i}.jpg")
    (root / "train_images.json").write_text(__import__("json").dumps(paths))


def enwik8_like(path: Path, n_train: int = 90_000_000, n_valid: int = 5_000_000, n_test: int = 400) -> None:
    """former's experiments/generate.py reads the first 90M + 5M + 5M bytes of enwik8 (gzip) and
    splits them at fixed offsets: a gzip of repeated text just past 95M bytes gives it a training
    and validation part and a test part of N_TEST bytes (its final evaluation runs over all of it).
    Highly repetitive, so the file is about 100 KB."""
    import gzip

    line = (" ".join(WORDS) + "\n").encode()
    total = n_train + n_valid + n_test
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=9) as f:
        block = line * (1_000_000 // len(line) + 1)
        left = total
        while left > 0:
            chunk = block[:left]
            f.write(chunk)
            left -= len(chunk)


def binarized_mnist(path: Path, n_train: int = 1000, n_valid: int = 500) -> None:
    """pytorch-made's binarized_mnist.npz: float32 0/1 arrays train_data / valid_data / test_data (N x 784)."""
    import numpy as np

    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: (rng.random((n, 784)) < 0.15).astype(np.float32)
              for k, n in (("train_data", n_train), ("valid_data", n_valid), ("test_data", n_valid))}
    np.savez_compressed(path, **arrays)


def _edit_config(path: Path, source: str, changes: dict, fmt: str) -> None:
    """Copy the repository's own config (SOURCE, next to PATH) to PATH with CHANGES applied
    ("a.b": value sets nested keys): small runs of config-driven scripts."""
    import json

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
            node = node[k]
        node[last] = value
    path.write_text(json.dumps(cfg, indent=2) if fmt == "json" else __import__("yaml").safe_dump(cfg))


def pytorch_template_config(path: Path) -> None:
    """victoresque/pytorch-template: config.json with 1 epoch, small batches, no worker processes."""
    _edit_config(path, "config.json", {"data_loader.args.batch_size": 32, "data_loader.args.num_workers": 0,
                                       "trainer.epochs": 2, "trainer.save_period": 1}, "json")


def simclr_config(path: Path) -> None:
    """sthalles/SimCLR (2020): config.yaml read from the working directory, fp16 off as shipped."""
    _edit_config(path, "config.yaml", {"batch_size": 4, "epochs": 1, "dataset.input_shape": "(32,32,3)",
                                       "log_every_n_steps": 1}, "yaml")


def simclr_config_fp16(path: Path) -> None:
    """The same with fp16_precision on (apex amp O2 when apex is there)."""
    _edit_config(path, "config.yaml", {"batch_size": 4, "epochs": 1, "dataset.input_shape": "(32,32,3)",
                                       "log_every_n_steps": 1, "fp16_precision": True}, "yaml")


def folder(path: Path) -> None:
    """An empty folder the script writes into (in the repository, git keeps no empty folder)."""
    path.mkdir(parents=True, exist_ok=True)


MAKERS = {
    "dir": folder,
    "mnist": mnist,
    "fashion_mnist": fashion_mnist,
    "cifar10": cifar10,
    "text": text,
    "wikitext": wikitext,
    "names": names,
    "names_dir": names_dir,
    "cora": cora,
    "image_folder": image_folder,
    "bsds300": bsds300,
    "carvana": carvana,
    "facades": facades,
    "sine": sine,
    "stl10": stl10,
    "sr_image_list": sr_image_list,
    "binarized_mnist": binarized_mnist,
    "enwik8_like": enwik8_like,
    "pytorch_template_config": pytorch_template_config,
    "simclr_config": simclr_config,
    "simclr_config_fp16": simclr_config_fp16,
}


def _load_extra_makers() -> None:
    """Makers of other corpus splits live in their own files (heldback/fakedata_*.py), so that a
    split can grow without touching this one; each defines a MAKERS dict of its own."""
    import importlib.util

    for extra in sorted(Path(__file__).resolve().parent.glob("*/fakedata_*.py")):
        spec = importlib.util.spec_from_file_location(f"_rw_{extra.parent.name}_{extra.stem}", extra)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for name, maker in getattr(mod, "MAKERS", {}).items():
            if name in MAKERS:
                raise KeyError(f"fake-data maker {name!r} of {extra} is already defined")
            MAKERS[name] = maker


_load_extra_makers()


def make(spec: str, cwd: Path) -> Path:
    """Run one "MAKER:PATH" spec relative to the script's directory CWD; returns the path."""
    maker, _, rel = spec.partition(":")
    if maker not in MAKERS:
        raise KeyError(f"unknown fake-data maker {maker!r} (have: {', '.join(sorted(MAKERS))})")
    path = Path(os.path.normpath(cwd / rel))
    MAKERS[maker](path)
    return path
