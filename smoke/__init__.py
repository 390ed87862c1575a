"""In-image smoke gate for training images.

Runs inside a built image (``smoke all``) and proves the Python stack works:
versions match the image's facts file, GPUs run real kernels (env), the
prebuilt DeepSpeed ops load with no compiler (ops), torch.compile builds a
training step (compile), a tiny DeepSpeed ZeRO-3 + LoRA job trains and
checkpoints (train), and all-reduce is correct and fast (nccl).  Kept free
of torch imports at package import time so the pure logic (signatures,
parsing, formulas) can be unit-tested with only the stdlib.
"""

CHECKS = ("env", "ops", "compile", "train", "nccl")
