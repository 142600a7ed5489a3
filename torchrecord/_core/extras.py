"""Optional dependencies: the extra of setup.cfg that installs each, and the hint to give.

torchrecord-lmdb is not on PyPI yet, so a hint names the package itself first (that
works wherever torchrecord came from) and then the extra, for a checkout.
tests/test_install.py checks this table against setup.cfg's ``extras_require``.
"""

from __future__ import annotations

__all__ = ["EXTRAS", "HF_HINT", "LEROBOT_HINT", "REMOTE_HINT", "S3_HINT", "install_hint"]

# extra name -> the requirement it installs (as in setup.cfg)
EXTRAS: dict[str, str] = {
    "compress": "cramjam>=2.11",
    "fastcrc": "isal>=1.6",
    "hdf5": "h5py>=3",
    "images": "pillow>=9",
    "progress": "tqdm>=4.60",
    "webdataset": "webdataset>=0.2",
}


def install_hint(extra: str) -> str:
    """``pip install 'pillow>=9' (or, in a torchrecord checkout: pip install -e '.[images]')``."""
    return f"pip install '{EXTRAS[extra]}' (or, in a torchrecord checkout: pip install -e '.[{extra}]')"


#: The ``remote`` extra installs two packages, so its hint is spelled out.
REMOTE_HINT = "pip install 'fsspec>=2023.1' 'aiohttp>=3.8' (or, in a torchrecord checkout: pip install -e '.[remote]')"

#: The ``hf`` extra installs two packages, so its hint is spelled out.
HF_HINT = "pip install 'datasets>=3' 'pyarrow>=14' (or, in a torchrecord checkout: pip install -e '.[hf]')"
#: The ``s3`` extra (s3:// URLs through s3fs), spelled out too.
S3_HINT = "pip install 's3fs>=2023.1' 'fsspec>=2023.1' (or, in a torchrecord checkout: pip install -e '.[s3]')"
#: The ``lerobot`` extra (LeRobot datasets in: parquet, images, videos), spelled out too.
LEROBOT_HINT = (
    "pip install 'pyarrow>=14' 'pillow>=9' 'av>=14' (or, in a torchrecord checkout: pip install -e '.[lerobot]')"
)
