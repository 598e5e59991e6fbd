#!/usr/bin/env python3
"""bench/dataloader_baseline.py in image mode with the transform of a real job.

    python3 bench/dataloader_images.py --transform eval|train [dataloader_baseline.py's flags]

--transform eval: torchvision's Resize(256) (bilinear, the shorter side to 256) +
CenterCrop(224) + PILToTensor(), what ``shardload bench --field
img=jpg:image:uint8:3x224x224:resize=256`` does; --transform train:
RandomResizedCrop(224) (bilinear, scale 0.08-1, ratio 3/4-4/3) +
RandomHorizontalFlip() + PILToTensor(), what ``--field
img=jpg:image:uint8:3x224x224:random-crop,flip`` does. Pass ``--image 224``. The rest
(the DataLoader, its workers, the tar streaming, the JSON it prints) is
dataloader_baseline.py's: only its ImageDecoder's transform is replaced, before the
DataLoader forks its workers.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dataloader_baseline  # noqa: E402


def transform_for(name, size):
    from torchvision import transforms

    bilinear = transforms.InterpolationMode.BILINEAR
    if name == "eval":
        return transforms.Compose([
            transforms.Resize(256 * size // 224, interpolation=bilinear),
            transforms.CenterCrop(size),
            transforms.PILToTensor(),
        ])
    return transforms.Compose([
        transforms.RandomResizedCrop(size, interpolation=bilinear),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])


def main():
    argv = sys.argv[1:]
    name = None
    if "--transform" in argv:
        i = argv.index("--transform")
        if i + 1 < len(argv):
            name = argv[i + 1]
        del argv[i:i + 2]
    if name not in ("eval", "train"):
        sys.exit("dataloader_images.py: --transform eval or --transform train is needed")
    init = dataloader_baseline.ImageDecoder.__init__

    def patched(self, size, field):
        init(self, size, field)
        self.transform = transform_for(name, size)

    dataloader_baseline.ImageDecoder.__init__ = patched
    sys.argv = [sys.argv[0]] + argv
    dataloader_baseline.main()


if __name__ == "__main__":
    main()
