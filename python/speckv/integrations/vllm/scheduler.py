"""``ConnectorScheduler``: the connector in vLLM's scheduler process: prompts matched against
the tier's index, a request held back while a save of its prefix is on its way, and each step's
loads and saves for the workers."""

from __future__ import annotations

import atexit
import shutil
import time
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

from .context import ConnectorContext
from .metrics import SideCounters, write_stats
from .requests import MAX_PENDING_SAVES, SAVE_POLL_S, SpeckvConnectorMetadata, _Load, _Save

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request


logger = init_logger(__name__)


class ConnectorScheduler:
    """The scheduler's part of vLLM's ``KVConnectorBase_V1`` API (``SpeckvConnector`` hands
    it the calls): it matches prompts against the tier's index (``has``: no entry read) and
    tells the workers what to load and what to store."""

    def __init__(self, context: ConnectorContext, kv_transfer_config: Any) -> None:
        config = context.config
        self.context = context
        self.store = context.store(weights=False)
        self.counters = SideCounters("scheduler", self.store)
        self._block_size = context.block_size
        self._save_wait_s = float(config.save_wait_s)
        # saves asked of the workers, [whole-block tokens, when to stop waiting for them (None
        # until the step that asked for them has run: the clock starts when the worker has the
        # blocks, not when the prefill that computes them begins), the step], and requests
        # waiting for one (request id -> when it began waiting)
        self._pending_saves: list[list[Any]] = []
        self._step = 0
        self._waiting: dict[str, float] = {}
        # per request: tokens matched; what to load (tokens vLLM had, the matched ids); its
        # prompt while it is computed, to store once it is
        self._matched: dict[str, int] = {}
        self._need_load: dict[str, tuple[int, list[int]]] = {}
        self._saving: dict[str, dict[str, Any]] = {}
        if context.memory_tier is not None:
            atexit.register(shutil.rmtree, context.memory_tier, True)
        if config.stats_file:
            atexit.register(self.write_stats)
        if config.load_failure == "recompute" and kv_transfer_config.kv_load_failure_policy != "recompute":
            kv_transfer_config.kv_load_failure_policy = "recompute"
            logger.info("speckv: kv_load_failure_policy set to 'recompute' (a block speckv cannot serve is computed)")

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        ids = list(request.prompt_token_ids or [])
        # vLLM computes at least the prompt's last token itself
        usable = (len(ids) - 1) // self._block_size * self._block_size
        self.counters.counts["matches"] += 1
        if usable <= num_computed_tokens:
            return 0, False
        n = self.store.match(ids[:usable], read=False)
        if n < usable and self._save_on_its_way(request.request_id, ids[:usable], n):
            time.sleep(SAVE_POLL_S)
            return None, False  # vLLM asks again at its next step
        self._matched[request.request_id] = n
        if n <= num_computed_tokens:
            return 0, False
        self.counters.counts["tokens_matched"] += n - num_computed_tokens
        self._need_load[request.request_id] = (num_computed_tokens, ids[:n])
        return n - num_computed_tokens, False

    def _save_on_its_way(self, req_id: str, ids: list[int], n: int) -> bool:
        """Whether ``req_id`` (its prompt's whole blocks ``ids``, ``n`` tokens of them stored)
        should wait for a save on its way that holds at least one more of its blocks: saves
        are forgotten ``save_wait_s`` after the step that computed their blocks, and a request
        waits at most that long in all."""
        now = time.monotonic()
        self._pending_saves = [p for p in self._pending_saves if p[1] is None or p[1] > now]
        began = self._waiting.get(req_id)
        if began is not None and now - began >= self._save_wait_s:
            self._stop_waiting(req_id, now)
            return False
        more = n + self._block_size
        if len(ids) >= more and any(len(t) >= more and t[:more] == ids[:more] for t, _, _ in self._pending_saves):
            if began is None:
                self._waiting[req_id] = now
                self.counters.counts["save_waits"] += 1
            return True
        self._stop_waiting(req_id, now)
        return False

    def _stop_waiting(self, req_id: str, now: float) -> None:
        began = self._waiting.pop(req_id, None)
        if began is not None:
            self.counters.seconds["save_wait_s"] += now - began

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if num_external_tokens == 0:
            self._need_load.pop(request.request_id, None)

    def build_connector_meta(self, scheduler_output: Any) -> SpeckvConnectorMetadata:
        meta = SpeckvConnectorMetadata()
        b = self._block_size
        self._step += 1
        now = time.monotonic()
        for pending in self._pending_saves:  # asked for in a step that has run since
            if pending[1] is None and pending[2] < self._step:
                pending[1] = now + self._save_wait_s
        for new in scheduler_output.scheduled_new_reqs:
            prompt = list(new.prompt_token_ids or [])
            blocks = list(new.block_ids[0])
            if new.req_id in self._need_load:
                local, tokens = self._need_load.pop(new.req_id)
                meta.loads.append(_Load(new.req_id, tokens, blocks[: len(tokens) // b], local // b))
            whole = len(prompt) // b
            if whole > self._matched.pop(new.req_id, 0) // b:  # blocks not stored yet
                self._saving[new.req_id] = {"prompt": prompt, "blocks": blocks, "done": 0}
            if new.req_id in self._saving:
                scheduled = scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
                self._saving[new.req_id]["done"] = new.num_computed_tokens + scheduled
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_blocks = cached.new_block_ids[i]
            resumed = req_id in getattr(cached, "resumed_req_ids", set())
            if req_id in self._need_load and resumed and new_blocks is not None:
                local, tokens = self._need_load.pop(req_id)
                meta.loads.append(_Load(req_id, tokens, list(new_blocks[0])[: len(tokens) // b], local // b))
            if req_id in self._saving:
                state = self._saving[req_id]
                if new_blocks is not None:
                    state["blocks"] = list(new_blocks[0]) if resumed else state["blocks"] + list(new_blocks[0])
                state["done"] = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
        for req_id in list(self._saving):
            state = self._saving[req_id]
            if state["done"] >= len(state["prompt"]):  # the whole prompt is computed this step
                whole = len(state["prompt"]) // b
                meta.saves.append(_Save(req_id, state["prompt"][: whole * b], state["blocks"][:whole]))
                del self._saving[req_id]
                if self._save_wait_s > 0 and whole:
                    kept = self._pending_saves[-(MAX_PENDING_SAVES - 1) :]
                    self._pending_saves = [*kept, [state["prompt"][: whole * b], None, self._step]]
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        for table in (self._matched, self._need_load, self._saving):
            table.pop(request.request_id, None)
        self._stop_waiting(request.request_id, time.monotonic())
        return False, None

    def stats(self) -> dict[str, Any]:
        """The scheduler's counters (``SideCounters.stats``): prompts and tokens matched."""
        return self.counters.stats()

    def write_stats(self) -> None:
        write_stats(self.context.config.stats_file, self.stats())

    def shutdown(self) -> None:
        """Writes the counters; the engine's RAM tier goes with it."""
        self.write_stats()
        if self.context.memory_tier is not None:
            shutil.rmtree(self.context.memory_tier, ignore_errors=True)


__all__ = ["ConnectorScheduler"]
