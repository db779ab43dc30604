"""Images from others, decoded within a pixel budget by the formats their reader expects.

The pixel limit (:data:`MAX_IMAGE_PIXELS`) is checked twice: on the header before any pixel is decoded, and on
the decoded image, since some formats decode to another size than their header says (an IPTC file embeds
another image). Each reader names the formats it decodes (``Image.open(path, formats=...)``): a file of
another format is refused whatever its name, so PIL never hands an EPS to Ghostscript or decodes an ICNS's
largest icon. PIL's own ``Image.MAX_IMAGE_PIXELS`` is the project's, and its ``DecompressionBombWarning`` is an
error while this module opens or decodes.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from npsemiseg.untrusted.errors import UnsafeFileError

#: The most pixels (width x height) an image may have: 8192 x 8192, 4x a 4K frame, 32x a Cityscapes
#: image; 256 MiB decoded as RGB.
MAX_IMAGE_PIXELS = 8192 * 8192
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS  # PIL's own bomb check (warning above, error above twice) at the same

#: what the dataset readers decode: the images of every dataset (VOC, Cityscapes, COCO, folders) are JPEG or PNG
IMAGE_FORMATS = ("JPEG", "PNG")
#: label maps: index PNGs only
LABEL_FORMATS = ("PNG",)
#: ``predict``'s inputs (its file suffixes: .png .jpg .jpeg .bmp .tif .tiff .webp)
PREDICT_FORMATS = ("JPEG", "PNG", "BMP", "TIFF", "WEBP")

_PIXELS = re.compile(r"\((\d+) pixels\)")


class ImageTooLargeError(UnsafeFileError):
    """An image with more than :data:`MAX_IMAGE_PIXELS` pixels (a decompression bomb)."""


class ImageFormatError(UnsafeFileError, UnidentifiedImageError):
    """A file that is not one of the formats its reader decodes (also PIL's "cannot identify" error)."""


def _too_large(path: Path, pixels: int | str, how: str = "declares") -> ImageTooLargeError:
    return ImageTooLargeError(f"image file {path} {how} {pixels} pixels, more than the {MAX_IMAGE_PIXELS:,} an "
                              "image may have (a decompression bomb, or an image to downscale first); refused")


def _check_size(path: Path, image: Image.Image, how: str) -> None:
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise _too_large(path, f"{width} x {height} = {width * height:,}", how)


@contextlib.contextmanager
def _bombs_refused(path: Path, how: str = "declares") -> Iterator[None]:
    """PIL's bomb warning and error as :class:`ImageTooLargeError` naming ``path``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            yield
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            found = _PIXELS.search(str(error))
            raise _too_large(path, f"{int(found.group(1)):,}" if found else "too many", how) from None


@contextlib.contextmanager
def open_image(path: str | os.PathLike, *, formats: Sequence[str] = IMAGE_FORMATS) -> Iterator[Image.Image]:
    """``PIL.Image.open(path, formats=formats)`` (lazy: header only), refusing a file of another format with
    :class:`ImageFormatError` and more than :data:`MAX_IMAGE_PIXELS` pixels with :class:`ImageTooLargeError`,
    before any pixel is decoded; PIL's own errors (missing file, corrupt data) propagate. Decode with
    :func:`decode_image` (or :func:`load_checked`), which checks the decoded size again."""
    path = Path(path)
    with _bombs_refused(path):
        try:
            image = Image.open(path, formats=list(formats))
        except UnidentifiedImageError:
            raise ImageFormatError(f"image file {path} is not a {' / '.join(formats)} image (the formats this "
                                   "reader decodes, whatever the file's name); refused") from None
    with image:
        _check_size(path, image, "declares")
        yield image


def load_checked(path: str | os.PathLike, image: Image.Image) -> Image.Image:
    """``image.load()`` of an image from :func:`open_image`, its decoded size checked against the limit."""
    path = Path(path)
    with _bombs_refused(path, "holds an image of"):  # e.g. an IPTC file's embedded image, opened as it decodes
        image.load()
    _check_size(path, image, "decodes to")
    return image


def decode_image(path: str | os.PathLike, *, formats: Sequence[str] = IMAGE_FORMATS) -> Image.Image:
    """The decoded image of ``path`` (file closed), within the pixel limit and of one of ``formats``
    (:func:`open_image`, then the decoded size checked again)."""
    with open_image(path, formats=formats) as image:
        return load_checked(path, image)
