"""The gates run one after another in one child process: torch import and versions, bf16
matmul against fp32, torch.compile forward+backward against eager, fused AdamW against the
for-each implementation. torch is imported lazily (this module is stdlib-only at import)."""

from __future__ import annotations

import importlib
import platform
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer.smoke.worker.protocol import FAIL, PASS, SKIP, Stopwatch, emit, result, short_error

MATMUL_REL_BOUND = 2e-2  # bf16 keeps 8 significant bits: ~4e-3 expected, a broken kernel gives ~1
COMPILE_REL_BOUND = 1e-3  # compiled vs eager gradients, relative to the largest gradient
OPTIMIZER_REL_BOUND = 1e-5  # fused vs for-each AdamW parameters after a few steps


def _torch() -> Any:
    return importlib.import_module("torch")


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def gate_torch(device: str, host_gpus: int) -> Dict[str, Any]:
    watch = Stopwatch()
    metrics: Dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    try:
        torch = _torch()
    except BaseException as e:  # ImportError, or a broken extension raising anything
        return result("torch", FAIL, watch.seconds, metrics,
                      f"importing torch with {sys.executable} (Python {platform.python_version()}): "
                      f"{short_error(e)}",
                      "the image must bring torch; nothing is installed into it")
    metrics.update({
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "distributed": bool(torch.distributed.is_available()),
        "threads": int(torch.get_num_threads()),
    })
    init_error: Optional[str] = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device == "cuda":
            try:
                torch.cuda.init()
            except Exception as e:  # the real CUDA error (35, 803, 804, ...) is in the text
                init_error = short_error(e)
        available = bool(torch.cuda.is_available())
    warned = "; ".join(str(w.message) for w in caught if "cuda" in str(w.message).lower())
    metrics["cudaAvailable"] = available
    if available:
        count = int(torch.cuda.device_count())
        metrics["deviceCount"] = count
        metrics["devices"] = [
            {"index": n, "name": str(torch.cuda.get_device_name(n)),
             "capability": ".".join(str(x) for x in torch.cuda.get_device_capability(n))}
            for n in range(count)
        ]
        metrics["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        try:
            nccl = torch.cuda.nccl.version()
            metrics["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # builds without NCCL
            metrics["nccl"] = None
    if device == "cpu":
        metrics["gloo"] = bool(torch.distributed.is_available() and torch.distributed.is_gloo_available())
        return result("torch", PASS, watch.seconds, metrics)
    if available:
        return result("torch", PASS, watch.seconds, metrics)
    why = init_error or warned or "torch.cuda.is_available() is False"
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU-only build"
    if host_gpus > 0:
        return result("torch", FAIL, watch.seconds, metrics,
                      f"CUDA is not usable inside the image although the host has {host_gpus} GPU(s): {why}",
                      "see the compat gate: an image CUDA newer than the driver needs compat libraries "
                      "on a data-center GPU, or a newer driver")
    return result("torch", SKIP, watch.seconds, metrics, None,
                  f"no CUDA device visible ({why}); use --device cpu to run the gates on the CPU")


def gate_matmul(torch: Any, device: str) -> Dict[str, Any]:
    watch = Stopwatch()
    n = 4096 if device == "cuda" else 256
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen)
    b = torch.randn(n, n, device=device, generator=gen)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
    ref = a @ b
    out = (a.bfloat16() @ b.bfloat16()).float()
    rel = float((out - ref).norm() / ref.norm())
    # throughput: a larger square on GPUs
    tn = 8192 if device == "cuda" else 256
    iters = 50 if device == "cuda" else 5
    x = torch.randn(tn, tn, device=device, generator=gen).bfloat16()
    y = torch.randn(tn, tn, device=device, generator=gen).bfloat16()
    for _ in range(3):
        x @ y
    _sync(torch, device)
    t0 = time.perf_counter()
    for _ in range(iters):
        x @ y
    _sync(torch, device)
    per = (time.perf_counter() - t0) / iters
    tflops = 2.0 * tn ** 3 / per / 1e12
    metrics = {"n": n, "relError": rel, "bound": MATMUL_REL_BOUND, "timedN": tn, "iters": iters,
               "secondsPerMatmul": per, "tflops": round(tflops, 3), "dtype": "bfloat16"}
    if not rel <= MATMUL_REL_BOUND:  # also catches NaN
        return result("matmul", FAIL, watch.seconds, metrics,
                      f"bf16 matmul differs from the fp32 reference: relative error {rel:.3g} > {MATMUL_REL_BOUND}")
    return result("matmul", PASS, watch.seconds, metrics)


def _max_rel(torch: Any, got: Sequence[Any], want: Sequence[Any]) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        scale = float(w.abs().max()) or 1.0
        worst = max(worst, float((g - w).abs().max()) / scale)
    return worst


def gate_compile(torch: Any, device: str) -> Dict[str, Any]:
    watch = Stopwatch()
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 8)).to(device)
    x = torch.randn(32, 64, device=device)
    y = torch.randn(32, 8, device=device)

    def step(m: Any) -> Any:
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        _sync(torch, device)
        return loss.detach()

    t0 = time.perf_counter()
    eager_loss = step(model)
    eager_s = time.perf_counter() - t0
    eager_grads = [p.grad.detach().clone() for p in model.parameters()]
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    try:
        compiled_loss = step(compiled)
    except Exception as e:
        return result("compile", FAIL, watch.seconds, {"backend": "inductor"},
                      f"torch.compile forward+backward: {short_error(e)}",
                      "inductor needs a C++ compiler (CPU) or Triton (GPU) and a writable /tmp in the image")
    compile_s = time.perf_counter() - t0
    compiled_grads = [p.grad.detach().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    step(compiled)
    steady_s = time.perf_counter() - t0
    grad_err = _max_rel(torch, compiled_grads, eager_grads)
    loss_err = abs(float(compiled_loss) - float(eager_loss)) / (abs(float(eager_loss)) or 1.0)
    metrics = {"backend": "inductor", "compileSeconds": round(compile_s, 3), "steadyStepSeconds": steady_s,
               "eagerStepSeconds": eager_s, "maxGradRelError": grad_err, "lossRelError": loss_err,
               "bound": COMPILE_REL_BOUND}
    if not (grad_err <= COMPILE_REL_BOUND and loss_err <= COMPILE_REL_BOUND):
        return result("compile", FAIL, watch.seconds, metrics,
                      f"compiled gradients differ from eager: relative error {grad_err:.3g} (loss {loss_err:.3g}) "
                      f"> {COMPILE_REL_BOUND}")
    return result("compile", PASS, watch.seconds, metrics)


def _adam_run(torch: Any, device: str, make: Callable[[List[Any]], Any], steps: int) -> List[Any]:
    gen = torch.Generator(device=device).manual_seed(1)
    shapes = [(256, 256), (256,), (1024, 64), (7,)]
    params = [torch.nn.Parameter(torch.randn(*s, device=device, generator=gen)) for s in shapes]
    opt = make(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, device=device, generator=gen)
        opt.step()
    _sync(torch, device)
    return [p.detach() for p in params]


def gate_optimizer(torch: Any, device: str) -> Dict[str, Any]:
    watch = Stopwatch()
    steps = 5
    kw = {"lr": 1e-2, "weight_decay": 0.01}
    t0 = time.perf_counter()
    ref = _adam_run(torch, device, lambda ps: torch.optim.AdamW(ps, foreach=True, **kw), steps)
    foreach_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        fused = _adam_run(torch, device, lambda ps: torch.optim.AdamW(ps, fused=True, **kw), steps)
    except (RuntimeError, ValueError) as e:
        if device == "cpu" and "cuda" in str(e).lower():
            return result("optimizer", SKIP, watch.seconds, {}, None,
                          f"this torch ({torch.__version__}) has no fused AdamW on the CPU: {short_error(e)}")
        return result("optimizer", FAIL, watch.seconds, {}, f"AdamW(fused=True): {short_error(e)}")
    fused_s = time.perf_counter() - t0
    err = _max_rel(torch, fused, ref)
    metrics: Dict[str, Any] = {"steps": steps, "maxParamRelError": err, "bound": OPTIMIZER_REL_BOUND,
                               "fusedSeconds": fused_s, "foreachSeconds": foreach_s, "apex": "absent"}
    errors = []
    if not err <= OPTIMIZER_REL_BOUND:
        errors.append(f"AdamW(fused=True) differs from AdamW(foreach=True): relative error {err:.3g} "
                      f"> {OPTIMIZER_REL_BOUND}")
    if device == "cuda":
        try:
            apex_opt = importlib.import_module("apex.optimizers")
        except ImportError:
            apex_opt = None
        if apex_opt is not None:
            apex_params = _adam_run(torch, device,
                                    lambda ps: apex_opt.FusedAdam(ps, adam_w_mode=True, **kw), steps)
            apex_err = _max_rel(torch, apex_params, ref)
            metrics["apex"] = {"maxParamRelError": apex_err}
            if not apex_err <= OPTIMIZER_REL_BOUND * 10:
                errors.append(f"apex FusedAdam differs from AdamW(foreach=True): relative error {apex_err:.3g}")
    if errors:
        return result("optimizer", FAIL, watch.seconds, metrics, "; ".join(errors))
    return result("optimizer", PASS, watch.seconds, metrics)


GATE_FUNCS = {"matmul": gate_matmul, "compile": gate_compile, "optimizer": gate_optimizer}


def run_gates(device: str, host_gpus: int, only: Sequence[str]) -> int:
    """Run the gates named in ``only`` (in protocol order), emitting a start and a result event
    for each. The torch gate runs (and is reported) only when named; it is always imported."""
    todo = list(only)
    torch_ok = True
    reason = ""
    if "torch" in todo:
        emit({"event": "start", "gate": "torch"})
        res = gate_torch(device, host_gpus)
        emit(res)
        torch_ok = res["status"] == PASS
        reason = res["error"] or res["detail"]
        todo.remove("torch")
    torch: Any = None
    if torch_ok:
        try:
            torch = _torch()
        except BaseException as e:
            torch_ok, reason = False, short_error(e)
    if torch_ok and device == "cuda" and not torch.cuda.is_available():
        torch_ok, reason = False, "no CUDA device"
    for name in todo:
        if not torch_ok:
            emit(result(name, SKIP, 0.0, None, None, f"not run: the torch gate did not pass ({reason})"))
            continue
        emit({"event": "start", "gate": name})
        watch = Stopwatch()
        try:
            res = GATE_FUNCS[name](torch, device)
        except Exception as e:
            res = result(name, FAIL, watch.seconds, None, short_error(e))
        emit(res)
    return 0
