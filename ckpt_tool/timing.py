"""Named timing spans: the package's one documented timing hook.

The save path, the resume (load) path, validation and the reshard copy wrap their phases in
``with span(name):``. Nobody listens by default, and then a span costs one attribute check and
a no-op context manager (about 0.1 microsecond). A caller that wants the figures turns
listening on for a block: ``listen(callback)`` receives every span as it ends, as
``(name, seconds, thread name)``; ``record(*names)`` keeps thread-seconds per name
(``Totals.take()``). Both check the names they are given against ``SPANS`` and raise
``ValueError`` for one that does not exist, so a benchmark written against a span that was
renamed or removed fails loudly instead of printing an empty column.

Spans may nest (``save.fsync`` runs inside ``save.write``) and may run in several threads at
once (the writer threads, the hashing threads): totals are thread-seconds per name, not parts of
a partition. A block that raises still reports its time. The names below are a stable,
documented list: renaming or removing one is a user-visible change (CHANGELOG).

==========================  ==================================================================
name                        what it covers
==========================  ==================================================================
state_dict.build_optimizer  building the state of an optimizer that has none yet (stride-0
                            zero gradients + a step with lr=0), before its state dict is taken;
                            nearly nothing when it has state (save and resume)
state_dict.get              torch's ``get_state_dict`` of the model and optimizer (save and
                            resume)
state_dict.set              making what DCP loaded the model's and optimizer's state
                            (``set_optimizer_state_dict``, or ``set_state_dict`` when DCP could
                            not fill the model in place)
save.write                  a sync save's ``dcp.save``: the files written through the hashing
                            writer (hashed as written) and fsynced, ``.metadata`` last
save.async_start            an async save's ``dcp.async_save`` call, until it returns (the
                            staging copy has started)
save.upload_wait            an async save's background thread waiting for DCP's upload
save.staging_wait           waiting for an async save's copy to CPU memory to finish (the
                            optimizer step's pre-hook, and ``save.wait``); nearly nothing when
                            no save is staging
save.wait                   waiting for the save in flight (staging, write, commit) to finish:
                            at the start of every save (at most one in flight), and at close
save.fsync                  fsync of one file DCP wrote (thread-seconds, in DCP's writer
                            threads; inside ``save.write`` or the upload)
save.hash_read_back         hashing the staged files that were not hashed as written (read back)
save.commit                 the distributed commit: per-rank JSON, hashes gathered, rank 0's
                            manifest and ``store.commit``, retention (every rank)
store.commit                the store's commit on rank 0: manifest written last, fsync, rename,
                            LATEST, index, under the directory's lock
store.read_manifest         reading and parsing one manifest
store.hash_files            the hash pass of a check of a checkpoint's files (every file listed
                            read and xxh3-hashed, ``threads`` at once)
resume.crash_cleanup        rank 0's clean-up of what a crash left, before a resume (a
                            roll-forward validates the newer step)
resume.structure_check      rank 0's structure check of the candidate (files and sizes, mesh,
                            DCP metadata readable; no hashes)
resume.load                 loading the candidate: DCP metadata checked, every file
                            hash-checked as DCP reads it, this rank's JSON state read
load.dcp                    ``dcp.load`` through the package's safe reader (inside
                            ``resume.load`` and ``reshard.load``)
load.read_file              reading one file whole while hashing it, before DCP deserializes
                            it (thread-seconds, in the reader's threads)
load.exchange               the cooperative load sending and receiving the items other ranks
                            read (after every file was read and checked)
validate.dcp_metadata       validation's read of the DCP ``.metadata`` with the restricted
                            unpickler (after the file is open)
recovery.carry_out          the recovery executor carrying out a plan (quarantine, LATEST,
                            removals) under the directory's lock
reshard.load                the reshard copy loading the source (every file hash-checked)
reshard.write               the reshard copy writing the new ranks' files (DCP's save protocol)
reshard.commit              the reshard copy's commit of the new checkpoint
==========================  ==================================================================

Example::

    from ckpt_tool import timing

    with timing.record("save.write", "save.commit") as totals:
        manager.save(step)
    print(totals.take())  # {"save.write": 1.92, "save.commit": 0.006}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import MappingProxyType, TracebackType

log = logging.getLogger("ckpt_tool")

#: Every span the package emits: name -> what it covers (the table above).
SPANS: MappingProxyType[str, str] = MappingProxyType(
    {
        "state_dict.build_optimizer": "building the state of an optimizer that has none yet, before its state dict is taken",
        "state_dict.get": "torch's get_state_dict of the model and optimizer",
        "state_dict.set": "making what DCP loaded the model's and optimizer's state",
        "save.write": "a sync save's dcp.save: files written, hashed as written, fsynced",
        "save.async_start": "an async save's dcp.async_save call, until it returns",
        "save.upload_wait": "an async save's background thread waiting for DCP's upload",
        "save.staging_wait": "waiting for an async save's copy to CPU memory to finish",
        "save.wait": "waiting for the save in flight (staging, write, commit) to finish",
        "save.fsync": "fsync of one file DCP wrote (thread-seconds)",
        "save.hash_read_back": "hashing the staged files that were not hashed as written",
        "save.commit": "the distributed commit: per-rank JSON, hashes gathered, manifest, store commit, retention",
        "store.commit": "the store's commit: manifest last, fsync, rename, LATEST, index",
        "store.read_manifest": "reading and parsing one manifest",
        "store.hash_files": "the hash pass of a check of a checkpoint's files",
        "resume.crash_cleanup": "rank 0's clean-up of what a crash left, before a resume",
        "resume.structure_check": "rank 0's structure check of the candidate (no hashes)",
        "resume.load": "loading the candidate, every file hash-checked as read, and this rank's JSON state",
        "load.dcp": "dcp.load through the package's safe reader",
        "load.read_file": "reading one file whole while hashing it (thread-seconds)",
        "load.exchange": "the cooperative load sending and receiving the items other ranks read",
        "validate.dcp_metadata": "validation's read of the DCP .metadata with the restricted unpickler",
        "recovery.carry_out": "the recovery executor carrying out a plan under the directory's lock",
        "reshard.load": "the reshard copy loading the source",
        "reshard.write": "the reshard copy writing the new ranks' files",
        "reshard.commit": "the reshard copy's commit of the new checkpoint",
    }
)

Listener = Callable[[str, float, str], None]
"""Called as each span ends: ``(name, seconds, thread name)``, in the thread that ran it."""

_listeners: tuple[Listener, ...] = ()  # replaced whole (copy on write): a span reads it once
_change = threading.Lock()


class _Silent:
    """The span when nobody listens: enters and exits doing nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_SILENT = _Silent()


class _Timed:
    """A span someone listens to: times the block and tells the listeners of the moment it began."""

    __slots__ = ("name", "listeners", "start")

    def __init__(self, name: str, listeners: tuple[Listener, ...]) -> None:
        self.name, self.listeners = name, listeners
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        seconds = time.perf_counter() - self.start
        thread = threading.current_thread().name
        for listener in self.listeners:
            try:
                listener(self.name, seconds, thread)
            except Exception:  # a listener's bug must not fail a save or a resume
                log.warning("ckpt: a timing listener failed on span %s", self.name, exc_info=True)


def span(name: str) -> _Silent | _Timed:
    """``with span(name):`` times the block for whoever listens (``listen``, ``record``).

    ``name`` is one of ``SPANS`` (the package's own spans; a unit test checks every call site).
    With nobody listening this is one attribute check and a shared no-op context manager."""
    listeners = _listeners
    if not listeners:
        return _SILENT
    return _Timed(name, listeners)


def check_names(names: tuple[str, ...] | list[str] | set[str] | frozenset[str]) -> None:
    """Raise ``ValueError`` naming every name that is not a span of ``SPANS``."""
    unknown = sorted(set(names) - set(SPANS))
    if unknown:
        raise ValueError(
            f"no such timing span: {', '.join(unknown)}; the spans are: {', '.join(SPANS)} (ckpt_tool.timing.SPANS documents each)"
        )


@contextmanager
def listen(listener: Listener) -> Iterator[None]:
    """``listener(name, seconds, thread)`` is called as each span ends, inside the block (any
    thread). Listeners nest and may be several at once; each sees every span."""
    global _listeners
    with _change:
        _listeners = (*_listeners, listener)
    try:
        yield
    finally:
        with _change:
            kept = list(_listeners)
            kept.remove(listener)
            _listeners = tuple(kept)


class Totals:
    """Thread-seconds and counts per span name, added up from any thread (see ``record``)."""

    def __init__(self, names: frozenset[str] | None) -> None:
        self.names = names
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float, thread: str) -> None:
        """The listener ``record`` installs."""
        if self.names is not None and name not in self.names:
            return
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds
            self._counts[name] = self._counts.get(name, 0) + 1

    def take(self) -> dict[str, float]:
        """The seconds per span that ran since the last ``take()`` (spans that did not run are
        absent), and start again from zero."""
        with self._lock:
            seconds, self._seconds, self._counts = self._seconds, {}, {}
        return seconds

    def counts(self) -> dict[str, int]:
        """How many times each span ended since the last ``take()``."""
        with self._lock:
            return dict(self._counts)


@contextmanager
def record(*names: str) -> Iterator[Totals]:
    """Totals of the spans ``names`` (all spans when none are given) that end inside the block.

    Raises ``ValueError`` before listening when a name is not one of ``SPANS``."""
    check_names(names)
    totals = Totals(frozenset(names) if names else None)
    with listen(totals.add):
        yield totals
