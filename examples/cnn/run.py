#!/usr/bin/python3
"""A LeNet-5 on Fashion-MNIST trained by 9 heterogeneous worker processes
on one machine, under five torch.distributed DDP variants (gloo) and ashl's
BSP, ADSP, ASHL and ASHL+, every method's links emulated by one model
(link.py); test accuracy against wall-clock time, evaluated by a separate
process on all 10,000 test images (evaluator.py). docs/cnn.md,
docs/perf/cnn.md.

    run.py --methods ddp,ashl --seeds 1 --out DIR          # ad hoc runs (configuration: the frozen file)
    run.py --tune --out DIR                                # the tuning grid on the tuning seeds (resumable)
    run.py --freeze examples/cnn/tuned.json --out DIR      # choose per method from DIR/tuning.jsonl, write the file
    run.py --protocol --out DIR                            # the test seeds under the committed frozen file
    run.py --report DIR                                    # the table again from DIR/results.jsonl
    run.py --quick --out DIR                               # 2 workers, 25 s per run: a smoke test

Every method runs the same model, initial parameters, samples (a pure
function of seed, rank and step), SGD with momentum and a linear warm-up,
compute padding and link model; each method's learning rate, warm-up and
own knob (PowerSGD's rank, post-local SGD's H, ASHL's r0) come from the
frozen tuning file (examples/cnn/tuned.json), chosen on the tuning seeds
with the same budget for every method (examples/cnn/grid.json).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "common"))

import cnn_common  # noqa: E402
import harness  # noqa: E402
import protocol  # noqa: E402

ALL_METHODS = protocol.ALL_METHODS
LABEL = protocol.LABEL
# Without a frozen file (before the tuning ran): the previous harness's settings.
# The DiLoCo family's (not in the tuning yet): the CNN's SGD with momentum as
# the inner optimizer at lr, 8 local steps per round (post-local SGD's default
# H, ASHL's h_ahl), DiLoCo's outer Nesterov at lr 0.7, momentum 0.9.
DEFAULT_CONFIG = {"lr": 0.05, "warmup_s": 0.0, "powersgd_rank": 1, "powersgd_start": 50, "local_period": 8,
                  "localsgd_start": 50, "ratio": 0.3, "local_steps": 8, "outer_lr": 0.7, "outer_momentum": 0.9}

WORKLOAD = harness.Workload(
    name="cnn", here=HERE, script=os.path.abspath(__file__), doc=__doc__, common=cnn_common,
    # The DiLoCo family can be named (protocol.OUTER_METHODS); it runs once the module has the diloco policy.
    methods=ALL_METHODS + protocol.OUTER_METHODS, runnable=ALL_METHODS, metric=protocol.ACCURACY,
    rivals=protocol.DDP_METHODS, rival_name="the best DDP variant",
    default_config=DEFAULT_CONFIG,
    defaults={"budget": 300.0, "time_scale": 5.0, "eval_every": 2.5, "target": 0.88, "momentum": 0.9,
              "quick_budget": 25.0},
    quick="ddp,bsp,ashl", title="LeNet-5 on Fashion-MNIST", plot_yrange=(0.5, 0.95), eval_unit="images",
    adsp_target_loss=0.4, switch_loss=0.5)

# What tests and other scripts call by this module's name.
frozen_is_committed = harness.frozen_is_committed
best_ddp_of = harness.best_ddp_of
load_frozen = harness.load_frozen


def main(argv):
    return harness.main(argv, WORKLOAD)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
