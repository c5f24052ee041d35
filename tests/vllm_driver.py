"""One vLLM engine run for tests/integrations/test_vllm.py and benches/bench_vllm.py (run in the vLLM
virtualenv, ``.ci/vllm-venv``; one process per run, so that a second run is a restart).

    python tests/vllm_driver.py CONFIG.json
    python tests/vllm_driver.py --host        # the engine host: a run per line of stdin

The engine host (``EngineHost``, for the tests) imports vLLM, torch and speckv once, then forks a
fresh process for every run it is sent: each run is still its own process (a restart), but none
pays the ~30 s of imports a cold start costs on two cores (the front, vLLM's engine core and its
worker each importing vLLM). vLLM's engine core and worker are forked from the run's process too
(``_fork_engine_processes``): they are separate processes as in serving, so the connector's
metadata crosses between its scheduler and worker sides as it does there.

CONFIG: ``model`` (a transformers folder), ``prompts`` (lists of token ids), ``connector``
("speckv", "example" or "none"), ``store``, ``calibration``, ``kv_cache_dtype``, ``max_tokens``,
``record`` (a folder: the worker writes there the blocks each request stored and the blocks
injected into it, as read back from vLLM's buffer), ``out`` (a JSON file: greedy outputs and
each request's time to first token), ``ttft_each`` (run the prompts one at a time, for times),
``workload`` (a serving workload run request by request, each timed to its first token:
``run_workload``), ``prefix_caching`` (vLLM's own, default off), ``max_num_batched_tokens``
(vLLM's default where absent), ``extra`` (more of the connector's ``kv_connector_extra_config``).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

try:  # the connectors below, importable by vLLM's engine process (this file's folder on its path)
    import torch

    from speckv.integrations.vllm import SpeckvConnector, SpeckvConnectorMetadata

    def _record(kind: str, req_id: str, layers: dict[int, Any]) -> None:
        folder = os.environ.get("SPECKV_TEST_RECORD")
        if folder:
            safe = "".join(c if c.isalnum() else "_" for c in req_id)
            torch.save(
                {i: (k.view(torch.uint8), v.view(torch.uint8)) for i, (k, v) in layers.items()},
                os.path.join(folder, f"{kind}-{safe}.pt"),
            )

    from speckv.integrations.vllm.worker import ConnectorWorker

    class RecordingWorker(ConnectorWorker):
        """A worker that also writes down, per request, the blocks it stored (what vLLM
        computed) and the blocks it injected (read back from vLLM's buffer once the step's
        loads are done: after the forward pass, as a layer-by-layer load ends there; the
        forward pass writes only the blocks after the loaded ones)."""

        def start_load_kv(self, meta: SpeckvConnectorMetadata) -> None:
            super().start_load_kv(meta)
            self._recording = list(meta.loads)

        def get_block_ids_with_load_errors(self) -> set[int]:
            failed = super().get_block_ids_with_load_errors()
            loads, self._recording = getattr(self, "_recording", []), []
            assert self.layout is not None or not loads
            for load in loads:
                served = [b for b in load.block_ids[load.first :] if b not in failed]
                if served:
                    _record(
                        "injected",
                        load.req_id,
                        {layer: self.layout.read(self.view(buf), served) for layer, buf in self.caches.items()},
                    )
            return failed

        def wait_for_save(self, meta: SpeckvConnectorMetadata) -> None:
            for save in meta.saves:
                layers = self.captured.get(save.req_id, {})
                if layers and self.layout is not None:
                    pairs = {i: self.layout.split(b.numpy()) for i, b in layers.items()}
                    _record(
                        "stored", save.req_id, {i: tuple(torch.from_numpy(t) for t in kv) for i, kv in pairs.items()}
                    )
            super().wait_for_save(meta)

    class RecordingSpeckvConnector(SpeckvConnector):
        """SpeckvConnector whose worker records what it stores and injects (``RecordingWorker``)."""

        worker_class = RecordingWorker

    class SlowSavingWorker(ConnectorWorker):
        """A worker whose background saves each take ``SPECKV_TEST_SAVE_DELAY_S`` seconds longer
        (a saver behind the requests, made certain; an environment variable, not a key of the
        connector's configuration, which refuses keys it does not know)."""

        def save_now(self, token_ids: list[int], blocks: list[Any], store: Any = None) -> int:
            time.sleep(float(os.environ.get("SPECKV_TEST_SAVE_DELAY_S", "0")))
            return super().save_now(token_ids, blocks, store)

    class SlowSavingSpeckvConnector(SpeckvConnector):
        """SpeckvConnector with a ``SlowSavingWorker``."""

        worker_class = SlowSavingWorker

except ImportError:  # imported by pytest outside the vLLM virtualenv: only the docs matter
    pass


def engine_env(folder: str) -> dict[str, str]:
    """The environment of a driver process: this folder importable (the recording connector),
    vLLM's CPU settings, no hub."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([folder, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["VLLM_CPU_KVCACHE_SPACE"] = env.get("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


class Engine:
    """Runs this driver in the vLLM virtualenv's ``python``, one process per run (so each run
    after the first is an engine restart); ``tmp``: where each run's config, outputs and
    records go."""

    def __init__(
        self,
        python: str,
        folder: str,
        calibration: str,
        prompts: list[list[int]],
        tmp: str,
        host: EngineHost | None = None,
        batch_tokens: int | None = None,
    ) -> None:
        self.python, self.folder, self.calibration, self.prompts = python, str(folder), str(calibration), prompts
        self.tmp = str(tmp)
        self.host = host
        self.batch_tokens = batch_tokens
        self.count = 0
        self._plain: dict[str, dict[str, Any]] = {}

    def plain(self, dtype: str = "auto") -> dict[str, Any]:
        """The run without a connector (once per cache dtype): the outputs every other run is
        held to. In one process (``in_process``): no connector, so nothing crosses processes."""
        if dtype not in self._plain:
            self._plain[dtype] = self.run("none", dtype=dtype, in_process=True)
        return self._plain[dtype]

    def run(
        self,
        connector: str,
        store: str | None = None,
        *,
        dtype: str = "auto",
        record: bool = False,
        in_process: bool = False,
        **more: Any,
    ):
        """One engine process. ``in_process``: vLLM's scheduler and worker in that one process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ~20 s a run instead of ~45 s: each of vLLM's
        processes imports vLLM again) for runs that are references, not the connector under
        test: by default a speckv run has its scheduler and worker sides in vLLM's own
        processes, as in serving, so its metadata crosses between them. With a ``host`` the run
        is a process it forks (``EngineHost``), without one a new interpreter."""
        from pathlib import Path

        self.count += 1
        work = Path(self.tmp) / f"run{self.count}"
        work.mkdir(parents=True)
        cfg = {
            "model": self.folder,
            "prompts": more.pop("prompts", self.prompts),
            "connector": connector,
            "store": store,
            "calibration": more.pop("calibration", self.calibration),
            "kv_cache_dtype": dtype,
            "out": str(work / "out.json"),
            "record": str(work / "record") if record else None,
            "max_num_batched_tokens": self.batch_tokens,
            **more,
        }
        (work / "config.json").write_text(json.dumps(cfg))
        here = os.path.dirname(os.path.abspath(__file__))
        mode = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}
        if self.host is not None:
            returncode = self.host.run(str(work / "config.json"), str(work / "log.txt"), mode, timeout=1800)
            log = (work / "log.txt").read_text(errors="replace")
        else:
            proc = subprocess.run(
                [self.python, os.path.join(here, "vllm_driver.py"), str(work / "config.json")],
                capture_output=True,
                text=True,
                env=dict(engine_env(here), **mode),
                timeout=1800,
            )
            returncode, log = proc.returncode, proc.stdout + proc.stderr
        if returncode != 0:
            raise RuntimeError(f"vLLM run {work} failed:\n{log[-4000:]}")
        result = json.loads((work / "out.json").read_text())
        result["log"] = log
        result["record"] = work / "record"
        return result


class EngineHost:
    """The engine host (``python vllm_driver.py --host`` in the vLLM virtualenv's ``python``):
    one interpreter that has imported vLLM, torch and speckv, forking a process per run. A run
    past its ``timeout`` is killed with every process it started (its process group)."""

    def __init__(self, python: str, log: str) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self._log = log
        self._errors = open(log, "w")
        self._proc = subprocess.Popen(
            [python, os.path.join(here, "vllm_driver.py"), "--host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            env=engine_env(here),
        )
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            if line.startswith("{"):
                self._replies.put(json.loads(line))
        self._replies.put(None)  # the host is gone

    def _reply(self, timeout: float) -> dict[str, Any]:
        reply = self._replies.get(timeout=timeout)
        if reply is None:
            self._errors.flush()
            raise RuntimeError(f"the engine host exited:\n{open(self._log).read()[-4000:]}")
        return reply

    def run(self, config: str, log: str, env: dict[str, str], timeout: float) -> int:
        """One run of ``main(config)`` in a forked process, its output in ``log``: its exit code."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"config": config, "log": log, "env": env}) + "\n")
        self._proc.stdin.flush()
        pid = self._reply(timeout=300)["pid"]
        try:
            return int(self._reply(timeout=timeout)["rc"])
        except queue.Empty:
            os.killpg(pid, signal.SIGKILL)
            self._reply(timeout=60)
            raise TimeoutError(f"vLLM run {config} took over {timeout} s (killed)") from None

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._errors.close()


def _fork_engine_processes() -> None:
    """vLLM's CPU platform sets its start method to spawn (``CpuPlatform.check_and_update_config``),
    so that its engine core and worker import vLLM afresh (~8 s each here); in the engine host
    they are forked from a process that has imported it, and are separate processes still."""
    from vllm.platforms.cpu import CpuPlatform

    update = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def keep_fork(cls: Any, vllm_config: Any) -> None:
        update(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(keep_fork)  # type: ignore[method-assign]
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"


def host() -> None:
    """The engine host's loop: a JSON line per run (``config``, ``log``, ``env``) on stdin; for
    each, a forked process runs it (its own process group, its output in ``log``), and two JSON
    lines answer on stdout: ``{"pid": ...}`` at its start, ``{"rc": ...}`` at its end. Only
    the main thread runs here, so forking is safe."""
    import transformers  # noqa: F401  (what every run imports, imported once)
    import vllm.v1.engine.core  # noqa: F401
    import vllm.v1.executor.multiproc_executor  # noqa: F401
    import vllm.v1.worker.cpu_model_runner  # noqa: F401
    import vllm.v1.worker.cpu_worker  # noqa: F401
    from vllm import LLM  # noqa: F401

    _fork_engine_processes()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked(request)  # never returns
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


def _run_forked(request: dict[str, Any]) -> None:
    """A run in the host's forked child: its output to its log, its settings in its environment,
    then ``main``; it leaves through ``SystemExit``, so that vLLM's engine shuts down (and the
    connector drains its saves) as at the end of a run's own interpreter."""
    os.setpgid(0, 0)
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.environ.update(request["env"])
        main(request["config"])
        code = 0
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def main(path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    cfg = json.loads(open(path).read())
    kind = cfg.get("connector", "speckv")
    transfer = None
    if kind == "speckv":
        extra = {"store": cfg["store"], **cfg.get("extra", {})}
        if "predictor" not in extra:  # a predicted store: the calibration names its predictor
            extra["calibration"] = cfg["calibration"]
        transfer = KVTransferConfig(
            kv_connector="RecordingSpeckvConnector" if cfg.get("record") else "SpeckvConnector",
            kv_connector_module_path="vllm_driver" if cfg.get("record") else "speckv.integrations.vllm",
            kv_role="kv_both",
            kv_connector_extra_config=extra,
        )
    elif kind == "example":
        transfer = KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": cfg["store"]},
        )
    if cfg.get("record"):
        os.makedirs(cfg["record"], exist_ok=True)
        os.environ["SPECKV_TEST_RECORD"] = cfg["record"]
    if cfg.get("save_delay_s"):
        os.environ["SPECKV_TEST_SAVE_DELAY_S"] = str(cfg["save_delay_s"])  # vLLM's processes inherit it
    if kind in ("speckv-free", "speckv-slow-save"):  # without a calibration (predictor in extra)
        slow = kind == "speckv-slow-save"
        transfer = KVTransferConfig(
            kv_connector="SlowSavingSpeckvConnector" if slow else "SpeckvConnector",
            kv_connector_module_path="vllm_driver" if slow else "speckv.integrations.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"store": cfg["store"], **cfg.get("extra", {})},
        )
    llm = LLM(
        model=cfg["model"],
        enforce_eager=True,
        kv_cache_dtype=cfg.get("kv_cache_dtype", "auto"),
        enable_prefix_caching=bool(cfg.get("prefix_caching", False)),
        kv_transfer_config=transfer,
        max_model_len=cfg.get("max_model_len", 2048),
        # vLLM's default (4096 here) sizes the warm-up forward pass each start makes: 5 s on two cores
        **({"max_num_batched_tokens": cfg["max_num_batched_tokens"]} if cfg.get("max_num_batched_tokens") else {}),
        seed=0,
    )
    if cfg.get("workload"):
        result = run_workload(llm, cfg["workload"])
        del llm  # the engine shuts down: the connector drains its saves and writes its counters
        import gc

        gc.collect()
        with open(cfg["out"], "w") as f:
            json.dump(result, f)
        return
    params = SamplingParams(max_tokens=cfg.get("max_tokens", 8), temperature=0.0)
    prompts = [{"prompt_token_ids": p} for p in cfg["prompts"]]
    outputs: list[list[int]] = []
    ttft: list[float] = []
    if cfg.get("ttft_each"):
        first = SamplingParams(max_tokens=1, temperature=0.0)
        for p in prompts:
            start = time.perf_counter()
            out = llm.generate([p], first, use_tqdm=False)
            ttft.append(time.perf_counter() - start)
            outputs.append(list(out[0].outputs[0].token_ids))
    else:
        for out in llm.generate(prompts, params, use_tqdm=False):
            outputs.append(list(out.outputs[0].token_ids))
    with open(cfg["out"], "w") as f:
        json.dump({"outputs": outputs, "ttft": ttft}, f)


def _timed(llm: Any, prompt: list[int], max_tokens: int) -> tuple[str, list[int], float, float]:
    """One request alone, greedy: (its id, output tokens, seconds to its first token, seconds
    in all)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    request_id = f"r{time.monotonic_ns()}"
    start = time.perf_counter()
    engine.add_request(request_id, {"prompt_token_ids": prompt}, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    first = None
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id and out.outputs:
                tokens = list(out.outputs[0].token_ids)
                if tokens and first is None:
                    first = time.perf_counter() - start
    total = time.perf_counter() - start
    return request_id, tokens, first if first is not None else total, total


def run_workload(llm: Any, workload: dict[str, Any]) -> dict[str, Any]:
    """A serving workload, one request at a time (each timed to its first token):

    - ``{"kind": "long-doc-qa", "requests": [[ids], ...], "max_tokens": N}``: the prompts in order;
    - ``{"kind": "multi-round", "system": [ids], "questions": [[[ids] per round] per user],
      "max_tokens": N}``: round by round, each user's prompt the system prompt, then every
      earlier question and the engine's answer to it, then the round's question.

    ``hooks``: ``{"i": argv}``, a command run (and waited for) before request ``i`` (a store
    killed or restarted mid-workload, in the tests).

    Returns per request its prompt's length, output tokens, TTFT and time, and the wall time."""

    max_tokens = int(workload.get("max_tokens", 8))
    hooks = {int(i): argv for i, argv in workload.get("hooks", {}).items()}
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    if workload["kind"] == "long-doc-qa":
        for i, prompt in enumerate(workload["requests"]):
            if i in hooks:
                subprocess.run(hooks[i], check=True, timeout=60)
            rid, out, ttft, total = _timed(llm, prompt, max_tokens)
            rows.append({"id": rid, "prompt_tokens": len(prompt), "output": out, "ttft": ttft, "time": total})
    elif workload["kind"] == "multi-round":
        users = workload["questions"]
        history = [list(workload["system"]) for _ in users]
        for r in range(max(len(q) for q in users)):
            for u, questions in enumerate(users):
                if r >= len(questions):
                    continue
                prompt = history[u] + list(questions[r])
                rid, out, ttft, total = _timed(llm, prompt, max_tokens)
                history[u] = prompt + out
                rows.append(
                    {
                        "id": rid,
                        "user": u,
                        "round": r,
                        "prompt_tokens": len(prompt),
                        "output": out,
                        "ttft": ttft,
                        "time": total,
                    }
                )
    else:
        raise ValueError(f"workload kind {workload['kind']!r}")
    return {"requests": rows, "wall_s": time.perf_counter() - start}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if sys.argv[1] == "--host":
        host()
    else:
        main(sys.argv[1])
