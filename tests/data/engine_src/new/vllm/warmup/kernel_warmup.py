import os

os.environ["SOME_CACHE_DIR"] = "~/.cache/engine"


class Experts:
    block = 64

    def apply(self, x):
        return x * 2 + self.down_table(x)

    def name(self):
        # a comment only
        return "experts"


def kernel_warmup(worker):
    if worker.router_dtype in ("float32", "bfloat16"):
        return ["router"]
    return []


def down_table(x):
    return x
