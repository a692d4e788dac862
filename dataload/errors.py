"""The loader's errors: each names the source (a path) and, for per-sample failures, the sample.

They extend the tierkit tree in ``tiers.io.errors``, so ``except TierkitError`` (or the builtin a
class also derives from, e.g. ``IndexError``) still catches them::

    TierkitError
     +- SourceError                               a source cannot be opened or used as a whole
     |   +- SourceFormatError (CorruptionError)   bad header, truncated file, unsupported layout
     +- SampleError                               one sample failed; ``source`` and ``sample_index``
         +- SampleIndexError (InvalidArgumentError, IndexError)   index past the end
         +- SampleReadError                       the OS failed the read (``errno``)
         +- CorruptSampleError (CorruptionError)  short read, checksum mismatch, undecodable page
         +- TransformError                        the user's transform raised

Only :class:`SampleError` subclasses other than :class:`SampleIndexError` are "skippable": a
loader built with ``on_error="skip"`` drops such samples and counts them; everything else raises.
"""

from __future__ import annotations

from tiers.io import CorruptionError, InvalidArgumentError, TierkitError

__all__ = [
    "CorruptSampleError",
    "SampleError",
    "SampleIndexError",
    "SampleReadError",
    "SourceError",
    "SourceFormatError",
    "TransformError",
]


class SourceError(TierkitError):
    """A data source as a whole is unusable; ``source`` is its path or name."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source


class SourceFormatError(SourceError, CorruptionError):
    """The source's bytes do not follow its format (bad magic, truncated, unsupported type)."""


class SampleError(TierkitError):
    """Sample ``sample_index`` of ``source`` could not be produced; the cause is chained."""

    def __init__(self, source: str, sample_index: int, message: str) -> None:
        super().__init__(f"{source}: sample {sample_index}: {message}")
        self.source = source
        self.sample_index = sample_index


class SampleIndexError(SampleError, InvalidArgumentError, IndexError):
    """The index is negative or past the end of the source (never skipped)."""

    @classmethod
    def check(cls, source: str, index: int, count: int) -> int:
        """``index`` as an int when ``0 <= index < count``; raises this error otherwise."""
        if not 0 <= index < count:
            raise cls(source, index, f"out of range for {count} samples")
        return int(index)


class SampleReadError(SampleError):
    """The operating system failed the read; ``errno`` is the OS error number (or None)."""

    def __init__(self, source: str, sample_index: int, message: str, errno: int | None) -> None:
        super().__init__(source, sample_index, message)
        self.errno = errno


class CorruptSampleError(SampleError, CorruptionError):
    """The sample's bytes are short, fail their checksum, or cannot be decoded."""


class TransformError(SampleError):
    """The user's ``transform`` raised on this sample (the original exception is chained)."""
