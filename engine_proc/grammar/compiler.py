"""Compiles structured-output specs against the served tokenizer on a background thread, cached by spec.

The busy loop never compiles: `lookup()` answers from the cache or queues the spec, and the
thread (xgrammar's compiler releases the GIL) puts a `GrammarCompiled` on the engine's input
queue when it is done, which wakes the loop to release the requests that waited for it.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rill.ipc.grammar_spec import GrammarError, error_text, spec_key, to_grammar
from rill.ipc.logs import route_transformers_logs
from rill.ipc.protocol import StructuredSpec

log = logging.getLogger("rill.engine")

GrammarKey = tuple[int, str]


@dataclass(frozen=True)
class GrammarCompiled:
    """On the engine's input queue: the compile of this spec ended, well or not."""

    key: GrammarKey


class GrammarCompiler:
    """`lookup(spec)`: the CompiledGrammar, its GrammarError, or None while it compiles.

    The bitmask is `vocab_size` wide, the model's logits width, which can exceed the
    tokenizer's vocabulary (padded embeddings): ids past the tokenizer's are never allowed.
    The tokenizer is loaded on the thread at the first compile (about 1.5 s), so a server
    that never sees a structured request never pays for it.
    """

    def __init__(self, model_dir: str | Path, *, vocab_size: int, stop_token_ids: list[int],
                 notify: Callable[[GrammarCompiled], None], max_cached: int = 256,
                 max_cached_chars: int = 64 << 20, max_threads: int = 2) -> None:
        self.model_dir = Path(model_dir)
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_cached = max_cached
        self.max_cached_chars = max_cached_chars  # the specs' text held as keys (a schema can be megabytes)
        self._cached_chars = 0
        self.max_threads = max_threads
        self._notify = notify
        self._lock = threading.Lock()
        self._results: OrderedDict[GrammarKey, object] = OrderedDict()  # LRU: CompiledGrammar | GrammarError
        self._in_flight: set[GrammarKey] = set()
        self._todo: queue.SimpleQueue[StructuredSpec] = queue.SimpleQueue()
        self._compiler = None  # xgrammar.GrammarCompiler, built on the thread
        self._thread = threading.Thread(target=self._run, name="engine-grammar", daemon=True)
        self._thread.start()

    def lookup(self, spec: StructuredSpec):
        """The compiled grammar or its GrammarError; None while it compiles (queued here if new)."""
        key = spec_key(spec)
        with self._lock:
            result = self._results.get(key)
            if result is not None:
                self._results.move_to_end(key)
                return result
            if key in self._in_flight:
                return None
            self._in_flight.add(key)
        self._todo.put(spec)
        return None

    def _run(self) -> None:
        while True:
            spec = self._todo.get()
            key = spec_key(spec)
            started = time.perf_counter()
            try:
                result = self._compile(spec)
            except GrammarError as exc:
                result = exc
            except Exception as exc:  # never the engine: the requests that wait for it end with ERROR
                log.exception("compiling a %s grammar failed", spec.kind.name)
                result = GrammarError(error_text(exc))
            log.debug("compiled a %s grammar in %.3f s%s", spec.kind.name, time.perf_counter() - started,
                      ": it failed" if isinstance(result, GrammarError) else "")
            with self._lock:
                self._in_flight.discard(key)
                self._results[key] = result
                self._cached_chars += len(key[1])
                # The newest stays, even alone over the bound: its requests are waiting for it.
                while len(self._results) > 1 and (len(self._results) > self.max_cached
                                                  or self._cached_chars > self.max_cached_chars):
                    old_key, _ = self._results.popitem(last=False)
                    self._cached_chars -= len(old_key[1])
            self._notify(GrammarCompiled(key))

    def _compile(self, spec: StructuredSpec):
        if self._compiler is None:
            self._compiler = self._new_compiler()
        return self._compiler.compile_grammar(to_grammar(spec))

    def _new_compiler(self):
        import xgrammar as xgr
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        route_transformers_logs()
        started = time.perf_counter()
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        except (OSError, ValueError):  # no tokenizer_config.json: the tokenizer.json the API workers read
            tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(self.model_dir / "tokenizer.json"))
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.stop_token_ids or None)
        log.info("structured outputs: tokenizer loaded for grammars in %.1f s", time.perf_counter() - started)
        # Results are cached here, errors included; xgrammar's own cache would hold them twice.
        return xgr.GrammarCompiler(info, max_threads=self.max_threads, cache_enabled=False)
