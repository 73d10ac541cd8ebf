"""Fake-data makers of the held-back split (loaded by ../fakedata.py into its MAKERS).

Same contract as fakedata.py: each maker gets one path (relative to the script's folder, or under
the run's HOME for "~/..." specs) and writes small seeded data in the exact on-disk format the
script reads. Names start with `hb_` so that they never clash with the development split's.
"""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
from pathlib import Path


def _rng(path: Path) -> random.Random:
    return random.Random("hb:" + str(path))


def _image(path: Path, size: tuple[int, int], mode: str = "RGB", levels: int = 256) -> None:
    from PIL import Image

    rng = _rng(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    channels = 1 if mode in ("L", "P") else len(mode)
    step = 256 // levels
    data = bytes(rng.randrange(levels) * step for _ in range(size[0] * size[1] * channels))
    Image.frombytes(mode, size, data).save(path)


def _classes(root: Path, n_classes: int, per_class: int, size: int) -> None:
    for c in range(n_classes):
        for i in range(per_class):
            _image(root / f"class{c}" / f"{i}.jpg", (size, size))


def cifar100(root: Path, n_train: int = 256, n_test: int = 64) -> None:
    """torchvision's CIFAR-100 layout: ROOT/cifar-100-python/{train,test,meta} (python pickles)."""
    import numpy as np

    rng = _rng(root)
    d = root / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        data = np.frombuffer(bytes(rng.randrange(256) for _ in range(n * 3072)), dtype=np.uint8)
        entry = {"data": data.reshape(n, 3072), "fine_labels": [i % 100 for i in range(n)],
                 "coarse_labels": [i % 20 for i in range(n)], "filenames": [f"{i}.png" for i in range(n)],
                 "batch_label": name}
        with open(d / name, "wb") as f:
            pickle.dump(entry, f)
    with open(d / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)],
                     "coarse_label_names": [f"s{i}" for i in range(20)]}, f)


def folder_2x12_64(root: Path) -> None:
    """An ImageFolder of 2 classes x 12 images, 64x64 (unconditional image models)."""
    _classes(root, 2, 12, 64)


def folder_10x3_64(root: Path) -> None:
    """An ImageFolder of 10 classes x 3 images, 64x64 (class-conditional models)."""
    _classes(root, 10, 3, 64)


def folder_8x4_32(root: Path) -> None:
    """An ImageFolder of 8 classes x 4 images, 32x32 (StarGAN's RaFD layout: one folder per expression)."""
    _classes(root, 8, 4, 32)


def folder_2x16_64(root: Path) -> None:
    """An ImageFolder of 2 classes x 16 images, 64x64 (DCGAN on a CelebA-like folder)."""
    _classes(root, 2, 16, 64)


def vgg16_weights(path: Path) -> None:
    """torchvision's cached ImageNet VGG-16 checkpoint (~/.cache/torch/hub/checkpoints/vgg16-397923af.pth),
    so that `vgg16(pretrained=True)` finds it and downloads nothing. Random values, every tensor
    stored as a small tensor expanded to the full shape: the file stays tiny, and load_state_dict
    copies the values into the model's own parameters."""
    import torch

    g = torch.Generator().manual_seed(0)
    sd = {}
    convs = [(0, 3, 64), (2, 64, 64), (5, 64, 128), (7, 128, 128), (10, 128, 256), (12, 256, 256),
             (14, 256, 256), (17, 256, 512), (19, 512, 512), (21, 512, 512), (24, 512, 512),
             (26, 512, 512), (28, 512, 512)]
    for i, cin, cout in convs:
        w = torch.randn(1, cin, 3, 3, generator=g) * (2.0 / (cin * 9)) ** 0.5 / cout ** 0.5
        sd[f"features.{i}.weight"] = w.expand(cout, cin, 3, 3)
        sd[f"features.{i}.bias"] = torch.zeros(1).expand(cout)
    for i, cin, cout in ((0, 25088, 4096), (3, 4096, 4096), (6, 4096, 1000)):
        sd[f"classifier.{i}.weight"] = (torch.randn(1, cin, generator=g) * 0.01).expand(cout, cin)
        sd[f"classifier.{i}.bias"] = torch.zeros(1).expand(cout)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)


def srcnn_train_h5(path: Path, n: int = 64, patch: int = 33) -> None:
    """SRCNN's prepare.py output for training: datasets `lr` and `hr`, (N, patch, patch) floats 0-255."""
    import h5py
    import numpy as np

    rs = np.random.RandomState(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        hr = rs.randint(0, 256, (n, patch, patch)).astype(np.float32)
        f.create_dataset("hr", data=hr)
        f.create_dataset("lr", data=np.clip(hr + rs.randn(n, patch, patch) * 8, 0, 255).astype(np.float32))


def srcnn_eval_h5(path: Path, n: int = 4, size: int = 48) -> None:
    """SRCNN's prepare.py --eval output: groups `lr` and `hr`, one dataset per image named str(i)."""
    import h5py
    import numpy as np

    rs = np.random.RandomState(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        lr, hr = f.create_group("lr"), f.create_group("hr")
        for i in range(n):
            h = rs.randint(0, 256, (size, size)).astype(np.float32)
            hr.create_dataset(str(i), data=h)
            lr.create_dataset(str(i), data=np.clip(h + rs.randn(size, size) * 8, 0, 255).astype(np.float32))


def div2k(root: Path) -> None:
    """SRGAN's layout: ROOT/DIV2K_train_HR/*.png and ROOT/DIV2K_valid_HR/*.png (high-resolution images)."""
    for i in range(8):
        _image(root / "DIV2K_train_HR" / f"{i:04d}.png", (96, 96))
    for i in range(5):  # its validation chunks the images by 15 (3 per image)
        _image(root / "DIV2K_valid_HR" / f"{800 + i:04d}.png", (64, 64))


def repdistiller_teacher(path: Path) -> None:
    """A teacher checkpoint as RepDistiller's train_teacher.py saves it ({'model': state_dict}), at
    save/models/<model>_.../<file>.pth: the model is built by the repository's own model_dict (its
    name is the folder name's first segment), in a child process so that its `models` package stays
    out of the harness."""
    root = path.parents[3]
    name = path.parent.name.split("_")[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys, torch; sys.path.insert(0, '.'); from models import model_dict; torch.manual_seed(0); "
            f"torch.save({{'model': model_dict[{name!r}](num_classes=100).state_dict(), 'epoch': 1}}, {str(path)!r})")
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True)


def pix2pixhd(root: Path, n: int = 4, size: int = 64) -> None:
    """pix2pixHD's aligned layout with --label_nc 0: ROOT/train_A/*.png (inputs) and ROOT/train_B/*.png."""
    for i in range(n):
        _image(root / "train_A" / f"{i}.png", (size, size))
        _image(root / "train_B" / f"{i}.png", (size, size))


def isic(root: Path, size: int = 64) -> None:
    """Image_Segmentation's ISIC layout: ROOT/{train,valid,test}/ISIC_<id>.jpg and
    ROOT/{split}_GT/ISIC_<id>_segmentation.png (binary masks)."""
    for split, n in (("train", 6), ("valid", 2), ("test", 2)):
        for i in range(n):
            sid = f"{split[:2]}{i:05d}"
            _image(root / split / f"ISIC_{sid}.jpg", (size, size))
            _image(root / f"{split}_GT" / f"ISIC_{sid}_segmentation.png", (size, size), mode="L", levels=2)


def ssd_voc(root: Path, n: int = 32, size: int = 64) -> None:
    """The SSD tutorial's create_data_lists.py output in ROOT: TRAIN_images.json (image paths, here
    relative to the script's folder), TRAIN_objects.json (boxes in pixels, VOC labels 1-20,
    difficulties), label_map.json; the same for TEST."""
    rng = _rng(root)
    labels = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
              "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
              "train", "tvmonitor"]
    root.mkdir(parents=True, exist_ok=True)
    for split, count in (("TRAIN", n), ("TEST", 8)):
        images, objects = [], []
        for i in range(count):
            rel = f"ssd_images/{split.lower()}_{i}.jpg"
            _image(root / rel, (size, size))
            images.append(rel)
            boxes, labs = [], []
            for _ in range(rng.randint(1, 3)):
                x0, y0 = rng.randint(0, size // 2), rng.randint(0, size // 2)
                boxes.append([x0, y0, x0 + rng.randint(8, size // 2), y0 + rng.randint(8, size // 2)])
                labs.append(rng.randint(1, 20))
            objects.append({"boxes": boxes, "labels": labs, "difficulties": [0] * len(boxes)})
        (root / f"{split}_images.json").write_text(json.dumps(images))
        (root / f"{split}_objects.json").write_text(json.dumps(objects))
    (root / "label_map.json").write_text(json.dumps({k: v + 1 for v, k in enumerate(labels)} | {"background": 0}))


def _json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))


_TEMPLATE = {"mode": "train", "cuda": True, "gpu_device": 0, "checkpoint_file": "checkpoint.pth.tar",
             "data_loader_workers": 0, "pin_memory": True, "async_loading": True}


def template_mnist_config(path: Path) -> None:
    """A small-run experiment config for the project template's MNIST agent (a user's own JSON,
    in the format of its configs/mnist_exp_0.json)."""
    _json(path, _TEMPLATE | {"exp_name": "hb_mnist", "agent": "MnistAgent", "seed": 1, "batch_size": 64,
                             "test_batch_size": 100, "learning_rate": 0.01, "momentum": 0.5, "max_epoch": 1,
                             "log_interval": 2, "validate_every": 1, "data_loader": "MnistDataLoader",
                             "data_mode": "download", "data_folder": ""})


def template_condensenet_config(path: Path) -> None:
    """The template's CondenseNet agent on CIFAR-10, a small network and one epoch."""
    _json(path, _TEMPLATE | {"exp_name": "hb_condensenet", "agent": "CondenseNetAgent", "seed": 1337,
                             "img_size": 32, "input_channels": 3, "num_classes": 10, "learning_rate": 0.1,
                             "lr_type": "cosine", "weight_decay": 0.0001, "momentum": 0.9, "stages": [2, 2, 2],
                             "growth_rate": [4, 4, 4], "conv_bottleneck": 4, "group1x1": 4, "group3x3": 4,
                             "condense_factor": 4, "init_stride": 1, "pool_size": 8, "dropout_rate": 0,
                             "batch_size": 32, "max_epoch": 1, "validate_every": 1,
                             "data_loader": "Cifar10DataLoader", "data_mode": "numpy_train",
                             "data_folder": "./data/cifar10/numpy/"})


def template_dcgan_config(path: Path) -> None:
    """The template's DCGAN agent on an image folder, small filters and one epoch."""
    _json(path, _TEMPLATE | {"exp_name": "hb_dcgan", "agent": "DCGANAgent", "seed": 12345, "image_size": 64,
                             "input_channels": 3, "relu_slope": 0.2, "g_input_size": 100, "num_filt_g": 8,
                             "num_filt_d": 8, "batch_size": 8, "num_classes": 2, "learning_rate": 0.0002,
                             "weight_decay": 0, "beta1": 0.5, "beta2": 0.999, "max_epoch": 1,
                             "validate_every": 1, "data_loader": "CelebADataLoader", "data_mode": "imgs",
                             "data_folder": "./data/celeba/", "x_train": "", "y_train": "", "x_valid": "",
                             "y_valid": "", "x_test": "", "y_test": ""})


MAKERS = {
    "hb_cifar100": cifar100,
    "hb_folder_2x12_64": folder_2x12_64,
    "hb_folder_10x3_64": folder_10x3_64,
    "hb_folder_8x4_32": folder_8x4_32,
    "hb_folder_2x16_64": folder_2x16_64,
    "hb_vgg16_weights": vgg16_weights,
    "hb_srcnn_train_h5": srcnn_train_h5,
    "hb_srcnn_eval_h5": srcnn_eval_h5,
    "hb_div2k": div2k,
    "hb_repdistiller_teacher": repdistiller_teacher,
    "hb_pix2pixhd": pix2pixhd,
    "hb_isic": isic,
    "hb_ssd_voc": ssd_voc,
    "hb_template_mnist_config": template_mnist_config,
    "hb_template_condensenet_config": template_condensenet_config,
    "hb_template_dcgan_config": template_dcgan_config,
}
