"""The torch ``Dataset`` of a dataset of files: one item per list entry, read as training reads it.

Apart from :mod:`npsemiseg.data.base` (which builds it), so that describing and checking a dataset
(``npsemiseg data check``) does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.datasets import load_image
from npsemiseg.data.info import DatasetInfo


class FilesDataset(Dataset):
    """Items from a dataset's files: ``definition`` (a ``DatasetDef`` class) and one ``ItemFiles`` per list entry.

    Items: ``image [3, H, W]`` float32 in [0, 1], ``label [H, W]`` int64 (all 255 where labels are not read:
    the unlabeled split), ``id`` str; then ``transform``. Every listed file must exist (checked here, naming
    the first missing ones); a file's content is checked when its item is loaded.
    """

    def __init__(self, definition: Any, info: DatasetInfo, root: Path, split: str, files: list[Any], *,
                 partition: str | None, partition_lists: str, transform: Callable[[dict], dict] | None) -> None:
        self.definition, self.info, self.root, self.split = definition, info, root, split
        self.files = files
        self.ids = [f.id for f in files]
        self.images = [f.image for f in files]
        self.labels = None if any(f.label is None for f in files) else [f.label for f in files]
        self.converted = [f.converted for f in files]
        self.partition, self.partition_lists, self.transform = partition, partition_lists, transform
        missing = [p for p in self.images + (self.labels or []) if not p.is_file()]  # type: ignore[operator]
        if missing:
            shown = ", ".join(str(p) for p in missing[:5])
            raise FileNotFoundError(
                f"{info.name} under {root} is missing {len(missing)} of {len(self.images) + len(self.labels or [])} "
                f"listed files, e.g. {shown} (expected {definition.layout} for every entry of the list)")

    def __len__(self) -> int:
        return len(self.files)

    def load_label(self, i: int) -> np.ndarray:
        """Item ``i``'s label as class indices and 255, uint8 ``[H, W]`` (decoded and validated)."""
        return self.definition.read_label(self.files[i])

    def __getitem__(self, i: int) -> dict:
        files = self.files[i]
        image = load_image(files.image)
        height, width = image.shape[1:]
        if self.labels is None:
            label = torch.full((height, width), IGNORE_INDEX, dtype=torch.int64)
        else:
            array = self.load_label(i)
            if array.shape != (height, width):
                raise ValueError(f"label file {files.label} is {array.shape[1]}x{array.shape[0]} (WxH) but image "
                                 f"{files.image} is {width}x{height}; expected the same size")
            label = torch.from_numpy(array.astype(np.int64))
        item = {"image": image, "label": label, "id": files.id}
        return self.transform(item) if self.transform is not None else item
