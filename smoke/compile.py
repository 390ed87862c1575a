"""compile check: torch.compile of a small training step, as users write it (inductor: C++ on CPU, triton on GPU).

Both backends compile code that includes Python.h at run time, so an image without the Python headers or a
C++ compiler fails here the way it fails for users ("Python.h: No such file or directory").
"""

import time


def run(res, facts, mode):
    import torch

    dev = torch.device("cuda" if mode == "gpu" else "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 16, device=dev)
    y = x.sum(dim=1, keepdim=True).sin()

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    compiled = torch.compile(step, backend="inductor")
    with torch.no_grad():
        eager = torch.nn.functional.mse_loss(model(x), y).item()
    t0 = time.monotonic()
    losses = []
    for i in range(4):
        opt.zero_grad()
        losses.append(compiled(x, y).item())
        opt.step()
        if i == 0:
            res.figures["first_step_seconds"] = round(time.monotonic() - t0, 2)  # compile time
    res.figures["losses"] = losses
    res.figures["backend"] = "inductor/" + ("triton" if mode == "gpu" else "cpp")
    res.add("compiled step matches eager", abs(losses[0] - eager) <= 1e-4 * max(1.0, abs(eager)),
            f"compiled {losses[0]:.6f}, eager {eager:.6f}")
    res.add("loss fell under the compiled step", losses[-1] < losses[0], f"{losses[0]:.4f} -> {losses[-1]:.4f}")
    res.summary = f"torch.compile ({res.figures['backend']}) trained: loss {losses[0]:.4f} -> {losses[-1]:.4f}"
