"""Fake-data makers of held-back split 4 (loaded by ../fakedata.py into its MAKERS).

Same contract as ../fakedata.py: each maker gets one path (relative to the script's folder, or
under the run's HOME for "~/..." specs) and writes small seeded data in the exact on-disk format
the script reads. Names start with `h4_` so that they never clash with another split's. Nothing
here is code of the corpus repositories: the formats are rebuilt from what the scripts read, and
config files are written from scratch with small settings (or are the repository's own ones,
passed with command-line overrides in the manifest).
"""

from __future__ import annotations

import json
import pickle
import random
import zlib
from pathlib import Path

def _seed(path: Path, tag: str = "") -> int:
    # seeded by the data set's name (not by where the tree lies), so that exports are reproducible
    return zlib.crc32(("h4:" + tag + ":" + path.parent.name + "/" + path.name).encode())


def _rng(path: Path, tag: str = "") -> random.Random:
    return random.Random(_seed(path, tag))


def _np_rng(path: Path, tag: str = ""):
    import numpy as np

    return np.random.RandomState(_seed(path, tag))


def _image(path: Path, size: tuple[int, int], rs, mode: str = "RGB") -> None:
    """A small image (flat blocks plus noise) in the format the suffix names."""
    import numpy as np
    from PIL import Image

    w, h = size
    ch = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    base = rs.randint(0, 256, size=(1, 1, ch))
    yy, xx = np.mgrid[0:h, 0:w]
    blocks = (((xx * 4) // w + (yy * 4) // h) % 2 * 60)[..., None]
    arr = (base + blocks + rs.randint(-40, 41, size=(h, w, ch))) % 256
    if mode == "RGBA":
        arr[..., 3] = np.where(blocks[..., 0] > 0, 255, rs.randint(0, 256, size=(h, w)))
    arr = arr.astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr[..., 0] if mode == "L" else arr, mode).save(path)




# ----------------------------------------------------------------------------- image data sets
def h4_cifar10_large(root: Path, per_batch: int = 1100) -> None:
    """torchvision's CIFAR-10 layout with more than 500 images a class (a semi-supervised split
    keeps 500 a class for validation and needs unlabelled ones beyond them)."""
    import numpy as np

    rs = np.random.RandomState(41)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = per_batch if name != "test_batch" else 200
        entry = {"batch_label": name, "labels": [i % 10 for i in range(n)],
                 "data": rs.randint(0, 256, size=(n, 3072)).astype(np.uint8),
                 "filenames": [f"{i}.png" for i in range(n)]}
        with open(d / name, "wb") as f:
            pickle.dump(entry, f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": per_batch, "num_vis": 3072}, f)


def h4_image_folder(root: Path, classes: int = 2, per_class: int = 10, size: int = 40) -> None:
    """ImageFolder layout: ROOT/<class>/<n>.jpg."""
    rs = _np_rng(root, "imgfolder")
    for c in range(classes):
        for i in range(per_class):
            _image(root / f"class{c}" / f"{i:04d}.jpg", (size, size), rs)


def h4_office(root: Path, classes: int = 3, per_class: int = 6, size: int = 48) -> None:
    """Office-31 layout: ROOT/<domain>/<class>/<n>.jpg for two domains with the same classes."""
    rs = _np_rng(root, "office")
    names = ["back_pack", "bike", "calculator", "headphones", "keyboard"][:classes]
    for dom in ("amazon", "webcam"):
        for c in names:
            for i in range(per_class):
                _image(root / dom / c / f"frame_{i:04d}.jpg", (size, size), rs)


def h4_cub(root: Path, classes: int = 8, per_class: int = 6, size: int = 64) -> None:
    """CUB-200-2011 image layout: ROOT/images/<NNN.Name>/<name>.jpg (first half of the classes
    train, second half test, as metric-learning code splits them)."""
    rs = _np_rng(root, "cub")
    for c in range(1, classes + 1):
        d = root / "images" / f"{c:03d}.Bird_{c}"
        for i in range(per_class):
            _image(d / f"Bird_{c}_{i:04d}_{c}.jpg", (size, size), rs)




def h4_omniglot_npy(path: Path, classes: int = 1210, per_class: int = 20, size: int = 24) -> None:
    """The cached array an Omniglot N-shot loader reads instead of the images: 20 images of every
    character class, [classes, 20, size, size, 1] (the first 1200 classes train, the rest test).
    uint8 to keep the file small (the loader casts the episodes to float32)."""
    import numpy as np

    rs = np.random.RandomState(_seed(path, "omni-npy"))
    x = (rs.rand(classes, per_class, size, size, 1) < 0.15).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, x)






def h4_blender(root: Path, n: tuple[int, int, int] = (4, 2, 2), size: int = 16) -> None:
    """NeRF's synthetic-Blender layout: ROOT/transforms_{train,val,test}.json (camera angle, frames
    with file paths and 4x4 camera-to-world matrices) and RGBA PNGs ROOT/<split>/r_<i>.png."""
    import math

    rs = _np_rng(root, "blender")
    root.mkdir(parents=True, exist_ok=True)
    for split, k in zip(("train", "val", "test"), n):
        frames = []
        for i in range(k):
            th = 2 * math.pi * i / k
            c, s = math.cos(th), math.sin(th)
            m = [[c, 0.0, s, 4.0 * s], [s, 0.0, -c, -4.0 * c], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]]
            frames.append({"file_path": f"./{split}/r_{i}", "rotation": 0.012, "transform_matrix": m})
            _image(root / split / f"r_{i}.png", (size, size), rs, "RGBA")
        (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": 0.6911, "frames": frames}))


def h4_nerf_config(path: Path) -> None:
    """A config file in the configargparse format NeRF's configs use (key = value lines)."""
    path.write_text(
        "expname = h4_blender\nbasedir = ./logs\ndatadir = ./data/h4_blender\ndataset_type = blender\n"
        "no_batching = True\nuse_viewdirs = True\nwhite_bkgd = True\nlrate_decay = 500\n"
        "N_samples = 8\nN_importance = 8\nN_rand = 64\nprecrop_iters = 0\nhalf_res = False\n"
        "netdepth = 2\nnetwidth = 32\nnetdepth_fine = 2\nnetwidth_fine = 32\nchunk = 4096\nnetchunk = 8192\n"
        "multires = 4\nmultires_views = 2\ni_print = 10\ni_img = 1000000\ni_weights = 100\n"
        "i_testset = 1000000\ni_video = 1000000\n")




# ----------------------------------------------------------------------------- tabular / series
def h4_ts_csv(path: Path, rows: int = 720, cols: int = 6) -> None:
    """A long-term forecasting CSV in the ETT/custom layout: a 'date' column (hourly), feature
    columns and the target column 'OT' last."""
    import math

    rng = _rng(path, "ts")
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["date," + ",".join(f"f{j}" for j in range(cols)) + ",OT"]
    for r in range(rows):
        day, hour = divmod(r, 24)
        month, dom = divmod(day, 28)
        vals = [math.sin((r + 7 * j) / (6.0 + j)) * (1 + j) + rng.gauss(0, 0.1) for j in range(cols + 1)]
        lines.append(f"2016-{month + 1:02d}-{dom + 1:02d} {hour:02d}:00:00," + ",".join(f"{v:.4f}" for v in vals))
    path.write_text("\n".join(lines) + "\n")






def h4_power_npy(path: Path, rows: int = 4000) -> None:
    """The UCI household-power array as the MAF authors' preprocessing leaves it (data.npy,
    [N, 8] float64; their loader drops two columns and adds noise)."""
    import numpy as np

    rs = np.random.RandomState(_seed(path, "power"))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, rs.rand(rows, 8) * np.array([5.0, 0.5, 240.0, 20.0, 1.0, 2.0, 15.0, 1.0]))






def h4_anode_config(path: Path) -> None:
    """A JSON experiment config of an ODE-net study (data dimension, repetitions, synthetic data
    sets, model configs, training config) with small settings."""
    path.write_text(json.dumps({
        "data_dim": 2, "num_reps": 1, "viz_batch_size": 64,
        "datasets": [{"type": "sphere", "num_points_inner": 100, "num_points_outer": 150,
                      "inner_range": [0.0, 0.5], "outer_range": [1.0, 1.5]}],
        "model_configs": [{"type": "odenet", "hidden_dim": 16, "time_dependent": True, "lr": 1e-3},
                          {"type": "anode", "hidden_dim": 16, "time_dependent": True, "lr": 1e-3, "augment_dim": 2}],
        "training_config": {"batch_size": 64, "record_freq": 2, "print_freq": 2, "epochs": 2}}, indent=2))


# ----------------------------------------------------------------------------- checkpoints / configs
def _expanded_state_dict(shapes: dict[str, tuple], seed: str) -> dict:
    """A state dict whose tensors are one small slice expanded to the full shape: a tiny file whose
    values load_state_dict copies into the model's own parameters."""
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
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
    return sd


def _bn(prefix: str, c: int) -> dict[str, tuple]:
    return {f"{prefix}.weight": (c,), f"{prefix}.bias": (c,), f"{prefix}.running_mean": (c,),
            f"{prefix}.running_var": (c,), f"{prefix}.num_batches_tracked": ()}


def h4_resnet18_imagenet(path: Path) -> None:
    """torchvision's ImageNet ResNet-18 state dict (BasicBlocks, downsample.0/1 on the first block of
    layers 2-4, fc 512->1000), in the hub cache under the URL's file name."""
    import torch

    s: dict[str, tuple] = {"conv1.weight": (64, 3, 7, 7), **_bn("bn1", 64)}
    cin = 64
    for li, c in enumerate((64, 128, 256, 512), 1):
        for b in range(2):
            p = f"layer{li}.{b}"
            first_in = cin if b == 0 else c
            s[f"{p}.conv1.weight"] = (c, first_in, 3, 3)
            s.update(_bn(f"{p}.bn1", c))
            s[f"{p}.conv2.weight"] = (c, c, 3, 3)
            s.update(_bn(f"{p}.bn2", c))
            if b == 0 and li > 1:
                s[f"{p}.downsample.0.weight"] = (c, cin, 1, 1)
                s.update(_bn(f"{p}.downsample.1", c))
        cin = c
    s["fc.weight"], s["fc.bias"] = (1000, 512), (1000,)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(_expanded_state_dict(s, "r18-imagenet"), path)




def h4_cifar100(root: Path, n_train: int = 256, n_test: int = 128) -> None:
    """torchvision's CIFAR-100 layout: ROOT/cifar-100-python/{train,test,meta} python pickles with
    'fine_labels' (md5 is not checked: the harness shim skips it)."""
    import numpy as np

    rs = np.random.RandomState(43)
    d = root / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        entry = {"batch_label": name, "fine_labels": [i % 100 for i in range(n)],
                 "coarse_labels": [(i % 100) // 5 for i in range(n)],
                 "data": rs.randint(0, 256, size=(n, 3072)).astype(np.uint8),
                 "filenames": [f"{i}.png" for i in range(n)]}
        with open(d / name, "wb") as f:
            pickle.dump(entry, f)
    with open(d / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"class_{i}" for i in range(100)],
                     "coarse_label_names": [f"super_{i}" for i in range(20)]}, f)


def h4_wrn_28_4_teacher(path: Path, num_classes: int = 100) -> None:
    """A WideResNet-28-4 teacher checkpoint ({'model': state_dict}) in the layout of the usual
    CIFAR WideResNet (conv1, block{1,2,3}.layer.N with bn1/conv1/bn2/conv2 and convShortcut where
    the width changes, final bn1 and fc)."""
    import torch

    widths = [16, 64, 128, 256]
    s: dict[str, tuple] = {"conv1.weight": (16, 3, 3, 3)}
    for b in range(3):
        cin, cout = widths[b], widths[b + 1]
        for i in range(4):
            p = f"block{b + 1}.layer.{i}"
            ci = cin if i == 0 else cout
            s.update(_bn(f"{p}.bn1", ci))
            s[f"{p}.conv1.weight"] = (cout, ci, 3, 3)
            s.update(_bn(f"{p}.bn2", cout))
            s[f"{p}.conv2.weight"] = (cout, cout, 3, 3)
            if ci != cout:
                s[f"{p}.convShortcut.weight"] = (cout, ci, 1, 1)
    s.update(_bn("bn1", 256))
    s["fc.weight"], s["fc.bias"] = (num_classes, 256), (num_classes,)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": _expanded_state_dict(s, "wrn-28-4")}, path)




MAKERS = {
    "h4_cifar10_large": h4_cifar10_large,
    "h4_image_folder": h4_image_folder,
    "h4_office": h4_office,
    "h4_cub": h4_cub,
    "h4_omniglot_npy": h4_omniglot_npy,
    "h4_blender": h4_blender,
    "h4_nerf_config": h4_nerf_config,
    "h4_ts_csv": h4_ts_csv,
    "h4_power_npy": h4_power_npy,
    "h4_anode_config": h4_anode_config,
    "h4_resnet18_imagenet": h4_resnet18_imagenet,
    "h4_cifar100": h4_cifar100,
    "h4_wrn_28_4_teacher": h4_wrn_28_4_teacher,
}
