#!/usr/bin/python3
"""A small GPT (byte-level, 0.44 M parameters) trained on the text of
Python's documentation by 9 heterogeneous worker processes on one machine,
under torch.distributed DDP (plain, post-local SGD) and ashl's ADSP, ASHL
and ASHL+ (and the DiLoCo family once the module has its policy), AdamW
the inner optimizer of every method, every method's links emulated by one
model (examples/common/link.py); validation bits per byte against
wall-clock time, scored by a separate evaluator process on a fixed
held-out slice. The CNN example's harness and protocol
(examples/common), with this workload. docs/lm.md, docs/perf/lm.md.

    run.py --methods ddp,ashl --seeds 1 --out DIR          # ad hoc runs (configuration: the frozen file, if any)
    run.py --tune --out DIR                                # the tuning grid on the tuning seeds (resumable)
    run.py --freeze examples/lm/tuned.json --out DIR       # choose per method from DIR/tuning.jsonl, write the file
    run.py --protocol --out DIR                            # the test seeds under the committed frozen file
    run.py --report DIR                                    # the table again from DIR/results.jsonl
    run.py --quick --out DIR                               # 2 workers, 60 s per run, ddp,ddp_localsgd,ashl

Every method runs the same model, initial parameters, sequences (a pure
function of seed, rank and step), AdamW with a linear warm-up, compute
padding and link model; each method's learning rate and own knob
(post-local SGD's H, ASHL's r0, the DiLoCo family's local steps) come from
the frozen tuning file (examples/lm/tuned.json, once the tuning ran),
chosen on the tuning seeds with the same budget for every method
(examples/lm/grid.json).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "common"))

import harness  # noqa: E402
import lm_common  # noqa: E402
import protocol  # noqa: E402

# The methods that run today; the DiLoCo family is named and refused by name until the module has its policy.
METHODS = ("ddp", "ddp_localsgd", "adsp", "ashl", "ashl_plus")
RIVALS = ("ddp", "ddp_localsgd") + protocol.OUTER_RIVALS
# Without a frozen file (before the tuning ran): AdamW's usual settings for a model this size.
DEFAULT_CONFIG = {"lr": 0.003, "warmup_s": 5.0, "weight_decay": 0.1, "local_period": 8, "localsgd_start": 20,
                  "ratio": 0.3, "local_steps": 50, "outer_lr": 0.7, "outer_momentum": 0.9}

WORKLOAD = harness.Workload(
    name="lm", here=HERE, script=os.path.abspath(__file__), doc=__doc__, common=lm_common,
    methods=METHODS + protocol.OUTER_METHODS, runnable=METHODS, metric=protocol.BITS_PER_BYTE,
    rivals=RIVALS, rival_name="the best rival",
    default_config=DEFAULT_CONFIG,
    defaults={"budget": 300.0, "time_scale": 5.0, "eval_every": 5.0, "target": 4.0, "momentum": 0.9,
              "quick_budget": 60.0, "quick_max_attempts": 1, "best_ddp_stand_in": "ddp_localsgd"},
    quick="ddp,ddp_localsgd,ashl", title="GPT (0.44 M) on Python's documentation", plot_yrange=(3.0, 8.0), eval_unit="bytes",
    tokens_per_sample=lm_common.CONTEXT,
    # The training loss is in nats per byte: 1.9 nats is about 2.75 bits per byte.
    adsp_target_loss=1.9, switch_loss=1.9)


def main(argv):
    return harness.main(argv, WORKLOAD)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
