"""Writes a domain's procedural examples to array_record with TFDS, once per config.

``prepare(domain, data_dir, num_train, num_test, seed, num_val=..., **opts)`` builds (or reuses) the
dataset ``domain_records/<config>/<DATASET_VERSION>`` under ``data_dir`` and returns random-access sources of
decoded ``str`` records for ``train``, ``val`` and ``test`` (the record contract of domains.py). No TensorFlow is
needed: the files are written by TFDS's array_record writer and read back through
``builder.as_data_source()``.

Caching: the config name is ``<domain>_<12 hex of sha256>`` over the domain, its generator
``version``, the seed, the three sizes and every generator option, so any change builds a fresh
dataset instead of silently reusing stale files. Re-running with identical arguments only
opens the existing files.

Remote ``data_dir`` (``gs://...``): array_record is written and read by C++ on local files only, so the dataset is
built in (or copied down to) a local mirror of ``data_dir`` on each host (``files.local_mirror``) and copied up to
``data_dir``, its ``dataset_info.json`` last: a copy cut short is not taken for a finished dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os

import tensorflow_datasets as tfds
from absl import logging as absl_logging

from nemocascade import files
from nemocascade.data.domains import RECORD_KEYS, SPLITS, generate_split, get_domain

DATASET_VERSION = "1.1.0"  # 1.1.0: a validation split, taken out of train (test unchanged)
_DONE_FILE = "dataset_info.json"  # TFDS takes a directory holding it for a prepared dataset


@dataclasses.dataclass
class DomainConfig(tfds.core.BuilderConfig):
    """Everything that determines the records; ``name`` is a hash of it (see :func:`domain_config`)."""

    domain: str = ""
    seed: int = 0
    num_train: int = 0
    num_test: int = 0
    num_val: int = 0
    opts_json: str = "{}"  # generator options, JSON with sorted keys


def domain_config(domain: str, num_train: int, num_test: int, seed: int, num_val: int | None = None,
                  **opts) -> DomainConfig:
    """The config for these arguments; equal arguments give an equal ``name``. ``num_val`` defaults to
    ``num_test``."""
    spec = get_domain(domain)
    num_val = num_test if num_val is None else num_val
    for key, value in opts.items():
        try:
            json.dumps(value)
        except TypeError as e:
            raise TypeError(f"generator option {key!r}={value!r} is not JSON-serialisable; it "
                            "must be, so that it can name the cached dataset") from e
    for key, value in (("num_train", num_train), ("num_test", num_test), ("num_val", num_val)):
        if int(value) < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    opts_json = json.dumps(opts, sort_keys=True)
    identity = json.dumps({"domain": domain, "version": spec.version, "seed": int(seed),
                           "num_train": int(num_train), "num_test": int(num_test), "num_val": int(num_val),
                           "dataset_version": DATASET_VERSION, "opts": json.loads(opts_json)}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return DomainConfig(name=f"{domain}_{digest}", description=identity, domain=domain,
                        seed=int(seed), num_train=int(num_train), num_test=int(num_test), num_val=int(num_val),
                        opts_json=opts_json)


class DomainRecords(tfds.core.GeneratorBasedBuilder):
    """TFDS builder for one domain config; every feature is ``Text`` (read back as bytes)."""

    VERSION = tfds.core.Version(DATASET_VERSION)
    # TFDS looks for checksum/metadata files next to a packaged builder's code, which needs the
    # `importlib_resources` backport; procedural data has no such files, so skip the lookup.
    code_path = None

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="nemocascade procedural examples (record contract: data/domains.py)",
            features=tfds.features.FeaturesDict({k: tfds.features.Text() for k in RECORD_KEYS}),
            # Keep generation order on disk: record i of a split is generate_split(...)[i].
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download: the data is procedural
        cfg = self.builder_config
        sizes = {"train": cfg.num_train, "val": cfg.num_val, "test": cfg.num_test}
        return {split: self._generate_examples(split, sizes[split]) for split in SPLITS}

    def _generate_examples(self, split: str, n: int):
        cfg = self.builder_config
        records = generate_split(cfg.domain, split, n, cfg.seed, **json.loads(cfg.opts_json))
        for record in records:
            yield record["id"], record

    # TFDS prints these banners unconditionally with termcolor; a training log does not need them.
    def _log_download_bytes(self) -> None:
        pass

    def _log_download_done(self) -> None:
        pass


class RecordSource:
    """A grain ``RandomAccessDataSource`` of ``str`` records over one TFDS array_record split.

    TFDS without TensorFlow returns ``Text`` features as ``bytes``; this decodes them.
    Picklable by its build arguments (a grain worker process reopens the files quietly instead
    of unpickling TFDS's reader) and thread-safe like the reader it wraps.
    """

    def __init__(self, build_args: dict, split: str, source=None):
        self._build_args = build_args  # the arguments of `builder(...)`
        self._split = split
        self._source = source

    def _reader(self):
        if self._source is None:  # first use after unpickling
            b = builder(**self._build_args)
            with _quiet():
                self._source = b.as_data_source(split=self._split)
        return self._source

    def __getstate__(self) -> dict:
        return {"build_args": self._build_args, "split": self._split}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["build_args"], state["split"])

    def __len__(self) -> int:
        return len(self._reader())

    def __getitem__(self, index: int) -> dict[str, str]:
        return _decode(self._reader()[index])

    def __getitems__(self, indices) -> list[dict[str, str]]:
        return [_decode(r) for r in self._reader().__getitems__(list(indices))]

    def __repr__(self) -> str:  # grain checkpoints compare source reprs
        a = self._build_args
        name = domain_config(a["domain"], a["num_train"], a["num_test"], a["seed"], a.get("num_val"),
                             **a["opts"]).name
        return f"RecordSource({name}/{self._split}, n={len(self)})"


def _decode(record: dict) -> dict[str, str]:
    return {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in record.items()}


@contextlib.contextmanager
def _quiet():
    """Silences TFDS's progress bars and the 'Using custom data configuration' warning."""
    from tensorflow_datasets.core.utils import tqdm_utils

    bar_was_on = getattr(tqdm_utils, "_active", True)
    verbosity = absl_logging.get_verbosity()
    tfds.display_progress_bar(False)
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(verbosity)
        tfds.display_progress_bar(bar_was_on)


def builder(domain: str, data_dir: str, num_train: int, num_test: int, seed: int,
            opts: dict | None = None, num_val: int | None = None) -> DomainRecords:
    """The (not yet prepared) TFDS builder for these arguments, writing array_record."""
    opts = opts or {}
    config = domain_config(domain, num_train, num_test, seed, num_val, **opts)
    with _quiet():
        return DomainRecords(data_dir=os.fspath(data_dir), config=config,
                             file_format="array_record")


def prepare(domain: str, data_dir: str, num_train: int, num_test: int, seed: int, num_val: int | None = None,
            **opts) -> dict[str, RecordSource]:
    """Builds the dataset once (cached by config) and returns ``{"train": src, "val": src, "test": src}``
    (``num_val`` defaults to ``num_test``).

    Records are ``generate_split(domain, split, n, seed, **opts)`` in order, as str dicts.
    """
    remote = None if files.is_local(data_dir) else os.fspath(data_dir)
    args = dict(domain=domain, data_dir=files.local_mirror(remote) if remote else os.fspath(data_dir),
                num_train=num_train, num_test=num_test, seed=seed, opts=opts, num_val=num_val)
    b = builder(**args)
    if remote:  # this dataset's directory, if an earlier run (or another host) built it there
        mirrored = os.path.join(remote, os.path.relpath(b.data_dir, args["data_dir"]))
        files.sync_tree(mirrored, b.data_dir, last=_DONE_FILE)
        b = builder(**args)  # sees what was copied down
    with _quiet():
        b.download_and_prepare()
        sources = b.as_data_source()
    if remote:
        files.sync_tree(b.data_dir, mirrored, last=_DONE_FILE)
    return {split: RecordSource(args, split, sources[split]) for split in SPLITS}
