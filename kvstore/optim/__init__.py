"""kvstore.optim: optimizer-state offload.

``OffloadedOptimizer`` wraps an elementwise torch optimizer (AdamW, Adam, SGD, Adagrad,
RMSprop, NAdam, ...) and keeps its fp32 master weights and states in a tier (DRAM, or NVMe in
a directory), streamed subgroup by subgroup through a few reusable staging buffers; updates
are bit-identical to the wrapped optimizer's in memory::

    opt = OffloadedOptimizer(model.parameters(), torch.optim.AdamW, tier="nvme",
                             directory="/nvme/run1", lr=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step(); opt.zero_grad()
    torch.save(opt.state_dict(), "optimizer.pt")   # torch's layout, weights_only loadable
    opt.checkpoint("step-1000")                    # NVMe: a manifest, no copy
    opt.close()

Host memory (NVMe, or DRAM with ``resident=False``): ``slots * (1 + states) *
subgroup_bytes`` (rounded up to pages) plus one subgroup of gradients, ``slots`` = 4 by default
or as ``host_budget_bytes`` allows (at least 1), whatever the model size; subgroups are sized
from the model unless ``subgroup_bytes`` is given (sizing.py). ``master="params"`` (fp32 CPU
parameters) stores and moves only the states, as torch's own optimizer keeps no second fp32
copy (params_master.py: how a reopened state is paired with the parameters' step); the default
``master="auto"`` picks it for fp32 CPU parameters on NVMe, and an existing directory's own mode.
``OffloadError`` (a ``tiers.TierkitError``) is what it refuses with.
"""

from kvstore.optim.layout import OffloadError
from kvstore.optim.offloaded import OffloadedOptimizer

__all__ = ["OffloadError", "OffloadedOptimizer"]
