import os

os.environ.setdefault("SOME_CACHE_DIR", "~/.cache/engine")


class Experts:
    block = 64

    def apply(self, x):
        return x * 2

    def name(self):
        return "experts"


def kernel_warmup(worker):
    # warms the router GEMM for FP32 routers only
    if worker.router_dtype == "float32":
        return ["router"]
    return []


def retired():
    return None
