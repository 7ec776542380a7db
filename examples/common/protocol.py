"""The comparison protocol of the examples (docs/perf/cnn.md, docs/perf/lm.md):
the pure parts, without torch, so they are unit-tested
(test/python/test_cnn_protocol.py, test/python/test_lm.py,
test/python/test_lm_protocol.py). The CNN scores
test accuracy (higher is better, ACCURACY), the language model validation
bits per byte (lower is better, BITS_PER_BYTE): every function that reads a
score takes the Metric (default: the CNN's).

    order = run_order(methods, seed, salt)               # a method order per seed, random, reproducible
    pt, lo, hi = bootstrap_ci(times, median_of)          # a median and its 95 % percentile interval
    r = paired_ratio_ci(ashl_times, ddp_times)           # ratio of medians over paired seeds, with interval
    flagged(overruns, steps)                             # more than 2 % of iterations overran their pad
    frozen = freeze(grid, tuning_rows, ...)              # each method's configuration, chosen on the tuning seeds
    text = report_table(rows, frozen, target, budget)    # the markdown table of docs/perf/cnn.md

Times to target that were not reached are math.inf: a median or a bound
that involves them is shown as "> budget", never as a number it is not.
"""
import hashlib
import json
import math
import random

# The methods, in the order of every table. Knob: the method's own tuning axis.
DDP_METHODS = ("ddp", "ddp_fp16", "ddp_powersgd", "ddp_localsgd", "ddp_propbatch")
ASHL_METHODS = ("bsp", "adsp", "ashl", "ashl_plus")
ALL_METHODS = DDP_METHODS + ASHL_METHODS
LABEL = {"ddp": "DDP", "ddp_fp16": "DDP + fp16 hook", "ddp_powersgd": "DDP + PowerSGD",
         "ddp_localsgd": "DDP post-local SGD", "ddp_propbatch": "DDP, speed-proportional batches",
         "bsp": "BSP", "adsp": "ADSP", "ashl": "ASHL", "ashl_plus": "ASHL+"}
KNOB = {"ddp_powersgd": "powersgd_rank", "ddp_localsgd": "local_period", "ashl": "ratio", "ashl_plus": "ratio"}

# The DiLoCo family and ashl's composition with an outer optimizer. They can
# be named in every method table now; a run of one needs its policy in the
# installed ashl module (NEEDS_POLICY: DiLoCo's rounds, Delayed Nesterov's
# asynchronous outer steps, ASHL's plans with the outer optimizer), and
# missing_policies says so by name before anything starts.
OUTER_RIVALS = ("diloco", "streaming_diloco_4bit", "streaming_diloco_4bit_2way", "async_local_sgd")
OUTER_METHODS = OUTER_RIVALS + ("ashl_outer", "ashl_diloco_sw")
LABEL.update({"diloco": "DiLoCo", "streaming_diloco_4bit": "Streaming DiLoCo, 4-bit",
              "async_local_sgd": "Async Local-SGD, delayed Nesterov", "ashl_outer": "ASHL + outer optimizer",
              "streaming_diloco_4bit_2way": "Streaming DiLoCo, 4-bit both ways",
              "ashl_diloco_sw": "ASHL + outer optimizer, staleness-weighted"})
# The knob each one's grid varies: local steps per round; ASHL + outer
# optimizer's planner sets each worker's H_i itself (ashl_diloco reads no
# local_steps), so its knob is ASHL's r0, as for ASHL.
OUTER_KNOB = {m: "local_steps" for m in OUTER_RIVALS} | {"ashl_outer": "ratio", "ashl_diloco_sw": "ratio"}
NEEDS_POLICY = {"diloco": "diloco", "streaming_diloco_4bit": "diloco", "async_local_sgd": "async_diloco",
                "ashl_outer": "ashl_diloco", "streaming_diloco_4bit_2way": "diloco", "ashl_diloco_sw": "ashl_diloco"}
# Pieces the harness does not drive yet, by method: refused by name even where the policy is there
# (none today; streaming_diloco_4bit was, until its fragments and 4-bit codec were wired).
NOT_WIRED = {}

# The settings ASHL's planner runs with in every ASHL method (ashl, ashl_plus,
# ashl_outer, ashl_diloco_sw): the reference experiment's
# (examples/experiment_common.hpp make_setup); r0 comes from the configuration
# (ratio), the switch loss from the workload.
ASHL_PLAN = {"profile_iterations": 5, "h_ahl": 8, "h_shl": 2, "shl_staleness": 3, "planner": "profile",
             "profile_trim": 2}
# ashl_diloco_sw: ashl_outer with each pseudo-gradient weighted by its
# staleness tau in commits, (1 + tau)^-1/2: the simulator's fix for the
# asynchronous form's collapse at outer momentum 0.9 (docs/perf/diloco.md,
# "Stability of the asynchronous form"; the experiment's ashl_diloco_sw).
STALENESS_WEIGHT = {"ashl_diloco_sw": {"staleness_weight": "power", "staleness_exponent": 0.5}}

# Streaming DiLoCo, 4-bit (streaming_diloco_4bit; ashl.torch.StreamingDiLoCo):
# the model cut into P fragments of whole parameter tensors, fragment p with
# a server of its own (DiLoCo's outer optimizer per fragment), synchronised
# every H = local_steps inner steps at staggered offsets, its exchange
# overlapped with the next tau (delay) inner steps, then merged with mixing
# alpha; every fragment commit block-quantized to 4 bits by the servers'
# codec (block4: B = 64, an f32 scale a block, error feedback at the worker)
# at ratio 0.125, the replies dense. P, tau, alpha and the codec are the
# MLP's streaming_diloco8_4bit row's (docs/perf/diloco-streaming.md); H and
# the outer optimizer come from the configuration, as DiLoCo's.
# streaming_diloco_4bit_2way is the same with 4-bit replies too: each
# fragment server answers every pull after a worker's first with block4 of
# what that worker's copy lacks (docs/ps.md, "Compressed replies").
STREAMING = {"fragments": 4, "delay": 2, "alpha": 0.5}
STREAMING_CODEC = {"compression": "block4", "compression_ratio": 0.125}
STREAMING_METHODS = ("streaming_diloco_4bit", "streaming_diloco_4bit_2way")
STREAMING_REPLIES = {"streaming_diloco_4bit_2way": {"reply_compression": "block4"}}
# Every method a table may show, in table order (the CNN's nine first, as before).
KNOWN_METHODS = ALL_METHODS + OUTER_METHODS

OVERRUN_LIMIT = 0.02  # a run with more than 2 % of its iterations over their pad is flagged
# A run during which processes not its own used more than this share of the
# machine's CPU time (a compiler, another run) is flagged too: a method whose
# step is CPU-bound (DDP's gloo all-reduce on 2 cores) slows down under such
# load before its pads overrun, so the overrun rule alone would let it pass.
FOREIGN_LIMIT = 0.10




class Metric:
    """What the evaluator scores: its name (the rows' keys final_<name> and
    target_<name>), whether higher is better, how a value prints, and the
    milestones of the report's table."""

    def __init__(self, name, label, higher_is_better, milestones, digits):
        self.name, self.label, self.higher_is_better = name, label, higher_is_better
        self.milestones, self.digits = tuple(milestones), digits
        self.final_key, self.target_key = f"final_{name}", f"target_{name}"

    def reached(self, value, target):
        return value >= target if self.higher_is_better else value <= target

    def rank(self, value):
        """A sort key: smaller is better."""
        return -value if self.higher_is_better else value

    def harder(self, a, b):
        """True when target a is harder to reach than target b."""
        return a > b if self.higher_is_better else a < b

    def fmt(self, value):
        return f"{value:.{self.digits}f}"

    def fmt_milestone(self, value):
        return f"{100 * value:g} %" if self.name == "accuracy" else f"{value:g}"


ACCURACY = Metric("accuracy", "test accuracy", True, (0.80, 0.85, 0.87, 0.88, 0.89), 4)
BITS_PER_BYTE = Metric("bpb", "validation bits per byte", False, (6.0, 5.0, 4.5, 4.0, 3.75), 3)


# ------------------------------------------------------------------ methods

def policy_names(policy_help):
    """The policy names in ashl._ashl.policy_help()'s text (a line per
    policy that starts with two spaces and its name)."""
    out = []
    for line in policy_help.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.strip():
            out.append(line.split()[0])
    return out


def missing_policies(methods, available):
    """The error text for the methods that need a policy the installed module
    lacks (None when every one can run): names each method and its policy."""
    bad = [(m, NEEDS_POLICY[m]) for m in methods if m in NEEDS_POLICY and NEEDS_POLICY[m] not in available]
    if bad:
        return ("; ".join(f"{m} ({LABEL[m]}) needs the {p} policy" for m, p in bad)
                + f", which the installed ashl module does not have (its policies: {', '.join(available) or 'none'}): "
                "install a build with the DiLoCo family, or leave these methods out")
    unwired = [m for m in methods if m in NOT_WIRED]
    if unwired:
        return "; ".join(f"{m} ({LABEL[m]}): {NOT_WIRED[m]}" for m in unwired)
    return None


def outer_policy_settings(method, config, switch_loss):
    """The policy the server of a DiLoCo-family method served through one
    ashl server (not Streaming DiLoCo's fragment servers) runs: {"policy":
    name, "policy_params": {...}}. DiLoCo and Async Local-SGD: H =
    local_steps and the outer optimizer's lr and momentum (0.7, 0.9 by
    default); ashl_outer: ASHL's planner (ASHL_PLAN, r0 = ratio, the
    workload's switch loss) with the same outer optimizer; ashl_diloco_sw:
    ashl_outer's with its staleness weighting (STALENESS_WEIGHT)."""
    if method not in NEEDS_POLICY or method in STREAMING_METHODS:
        raise ValueError(f"method = {method!r}: not a DiLoCo-family method served by one server "
                         f"(those are {', '.join(m for m in OUTER_METHODS if m not in STREAMING_METHODS)})")
    outer = {"outer_lr": config.get("outer_lr", 0.7), "outer_momentum": config.get("outer_momentum", 0.9)}
    if NEEDS_POLICY[method] == "ashl_diloco":  # ASHL's planned H_i, shares and compression with the outer optimizer
        params = dict(ASHL_PLAN, compression_ratio=config.get("ratio", 0.3), switch_loss=switch_loss, **outer)
        params.update(STALENESS_WEIGHT.get(method, {}))
    else:
        params = dict(local_steps=int(config.get("local_steps", 8)), **outer)
    return {"policy": NEEDS_POLICY[method], "policy_params": params}


def streaming_worker_settings(config):
    """StreamingDiLoCo's schedule for the streaming methods: fragments,
    local_steps (the configuration's H), delay and alpha."""
    return dict(STREAMING, local_steps=int(config["local_steps"]))


def fragment_server_settings(method, config, workers):
    """The settings every fragment server of `method` starts with (the
    ashl.Server keywords beside its size, initial values and address): the
    method's policy with H and the outer optimizer's lr and momentum (0.7,
    0.9 by default, as DiLoCo's), the workers, the 4-bit codec of the
    commits and, for streaming_diloco_4bit_2way, of the replies."""
    if method not in STREAMING_METHODS:
        raise ValueError(f"method = {method!r}: only {' and '.join(STREAMING_METHODS)} run fragment servers")
    return {"policy": NEEDS_POLICY[method],
            "policy_params": {"local_steps": int(config["local_steps"]), "outer_lr": config.get("outer_lr", 0.7),
                              "outer_momentum": config.get("outer_momentum", 0.9)},
            "workers": int(workers), **STREAMING_CODEC, **STREAMING_REPLIES.get(method, {})}


# ------------------------------------------------------------------ order

def run_order(methods, seed, salt="issue27"):
    """The methods of one seed in a random order that is a pure function of
    (methods, seed, salt): the order is random per seed (no method always
    runs first on a fresh machine) and the same on a rerun."""
    methods = sorted(methods)  # the order they were given in does not matter
    rng = random.Random(f"{salt}:{seed}:{','.join(methods)}")
    rng.shuffle(methods)
    return methods


# ------------------------------------------------------------------ statistics

def median_of(values):
    v = sorted(values)
    if not v:
        return math.nan
    k = len(v) // 2
    if len(v) % 2:
        return v[k]
    a, b = v[k - 1], v[k]
    if math.isinf(a) and math.isinf(b) and a == b:
        return a
    return 0.5 * (a + b)


def _percentile(sorted_v, q):
    """The q-quantile (0..1) of sorted values, linear between order statistics."""
    if not sorted_v:
        return math.nan
    x = q * (len(sorted_v) - 1)
    i = int(math.floor(x))
    j = min(i + 1, len(sorted_v) - 1)
    a, b = sorted_v[i], sorted_v[j]
    if a == b or x == i:
        return a
    if math.isinf(a) or math.isinf(b):
        return b if x - i > 0 else a
    return a + (b - a) * (x - i)


def bootstrap_ci(values, stat=median_of, n_boot=10000, level=0.95, seed=0):
    """(stat(values), lower, upper): the percentile bootstrap interval of
    stat over resamples (with replacement) of values, n_boot of them, from a
    fixed seed (the same data give the same interval)."""
    values = list(values)
    if not values:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    n = len(values)
    boots = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    a = (1.0 - level) / 2.0
    return stat(values), _percentile(boots, a), _percentile(boots, 1.0 - a)


def _ratio(a, b):
    if math.isinf(a) and math.isinf(b):
        return math.nan  # neither reached the target: nothing to say
    if math.isinf(b):
        return 0.0 if not math.isinf(a) else math.nan
    if b <= 0:
        return math.nan
    return a / b


def paired_ratio_ci(a, b, n_boot=10000, level=0.95, seed=0):
    """median(a) / median(b) over seeds paired by index (a[i] and b[i] ran
    the same seed), with the percentile bootstrap interval from resampling
    the seeds (pairs together). inf (target not reached) in b makes the ratio
    a bound toward 0, in a toward inf; resamples where both medians are inf
    are dropped. Returns (ratio, lower, upper)."""
    if len(a) != len(b):
        raise ValueError(f"paired_ratio_ci: {len(a)} and {len(b)} values: the seeds must pair")
    if not a:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    n = len(a)
    boots = []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        r = _ratio(median_of([a[i] for i in idx]), median_of([b[i] for i in idx]))
        if not math.isnan(r):
            boots.append(r)
    boots.sort()
    q = (1.0 - level) / 2.0
    return (_ratio(median_of(a), median_of(b)), _percentile(boots, q) if boots else math.nan,
            _percentile(boots, 1.0 - q) if boots else math.nan)


# ------------------------------------------------------------------ overruns

def overrun_fraction(overruns, steps):
    return overruns / steps if steps > 0 else 1.0  # a run without iterations did not run as emulated


def flagged(overruns, steps, limit=OVERRUN_LIMIT, foreign=None, foreign_limit=FOREIGN_LIMIT):
    """True when more than `limit` of the iterations overran their pad (the
    machine, not the emulation, set the pace), or when other processes used
    more than `foreign_limit` of the machine during the run (foreign: that
    share, None when not measured)."""
    return overrun_fraction(overruns, steps) > limit or (foreign is not None and foreign > foreign_limit)


def run_until_clean(run, max_attempts=3, limit=OVERRUN_LIMIT):
    """Call run(attempt) -> row (with "overruns" and "iterations", and
    "foreign_busy" where measured: flagged()) until a
    row is not flagged, at most max_attempts times. Returns (the row to
    report, every row): the first clean one, or the last attempt's, marked
    "flagged": True, when none was clean. Each row gets "attempt" and
    "flagged"."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts = {max_attempts}: must be >= 1")
    rows = []
    for attempt in range(1, max_attempts + 1):
        row = dict(run(attempt))
        row["attempt"] = attempt
        row["flagged"] = flagged(row["overruns"], row["iterations"], limit, foreign=row.get("foreign_busy"))
        rows.append(row)
        if not row["flagged"]:
            return row, rows
    return rows[-1], rows


# ------------------------------------------------------------------ tuning

def grid_configs(grid, method):
    """The configurations of `method` in the grid (a list of dicts). Every
    method has the same number: the same tuning budget (checked)."""
    configs = grid["methods"][method]
    counts = {m: len(c) for m, c in grid["methods"].items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"tuning grid: methods have {counts} configurations: the budget must be equal")
    # A value the method does not read would spend tuning runs on
    # configurations that are one and the same (shown_config: what matters).
    for i, c in enumerate(configs):
        unread = sorted(set(c) - set(shown_config(method, c)))
        if unread:
            knob = KNOB.get(method) or OUTER_KNOB.get(method)
            raise ValueError(f"tuning grid: {method}#{i} sets {', '.join(unread)}, which {method} does not read "
                             f"(it reads lr, warmup_s{', ' + knob if knob else ''})")
    return [dict(c) for c in configs]


def config_key(config):
    return json.dumps(config, sort_keys=True)


def select(rows, method, budget, metric=ACCURACY):
    """The configuration of `method` with the lowest median time to target
    over its tuning rows (inf counts as not reached), ties broken by the
    better median final score, then by the key. rows: dicts with method,
    config, time_to_target_s (None: not reached), final_<metric>."""
    by = {}
    for r in rows:
        if r["method"] == method:
            by.setdefault(config_key(r["config"]), []).append(r)
    if not by:
        raise ValueError(f"no tuning rows for {method}")

    def score(k):
        rs = by[k]
        t = median_of([math.inf if r["time_to_target_s"] is None else r["time_to_target_s"] for r in rs])
        return (t, metric.rank(median_of([r[metric.final_key] for r in rs])), k)

    best = min(by, key=score)
    t, _, _ = score(best)
    final = median_of([r[metric.final_key] for r in by[best]])
    return {"config": json.loads(best), "median_time_to_target_s": None if math.isinf(t) else t,
            f"median_{metric.final_key}": final, "runs": len(by[best])}


def freeze(grid, rows, tuning_seeds, methods=ALL_METHODS, budget=None, created="", metric=ACCURACY):
    """The frozen file's content: each method's chosen configuration, the grid,
    the tuning seeds and every tuning row, and a digest of the selection.
    Refuses a method whose rows do not cover every grid configuration on every
    tuning seed (the budget was not spent equally)."""
    chosen = {}
    for m in methods:
        want = {(config_key(c), s) for c in grid_configs(grid, m) for s in tuning_seeds}
        have = {(config_key(r["config"]), r["seed"]) for r in rows if r["method"] == m}
        missing = want - have
        if missing:
            raise ValueError(f"{m}: {len(missing)} of {len(want)} tuning runs missing, e.g. {sorted(missing)[0]}")
        chosen[m] = select(rows, m, budget, metric)
    body = {"tuning_seeds": list(tuning_seeds), "grid": grid, "chosen": chosen, "created": created,
            "rows": rows}
    body["digest"] = digest(chosen)
    return body


def tuning_status(grid, rows, tuning_seeds, methods, budget, metric=ACCURACY):
    """The tuning so far, as markdown: how many of the grid's runs are done
    (in all and per method), then one line per done run in the order they
    were made (rows: tuning.jsonl's), with the machine's load average at
    its start and end (what else ran shows there). Chooses nothing: a configuration is
    chosen only by freeze(), once every run is in."""
    total = sum(len(grid_configs(grid, m)) for m in methods) * len(tuning_seeds)
    done = [r for r in rows if r["method"] in methods]
    per = {m: sum(1 for r in done if r["method"] == m) for m in methods}
    each = len(grid_configs(grid, methods[0])) * len(tuning_seeds) if methods else 0
    lines = [f"**{len(done)} of {total} tuning runs** ("
             + ", ".join(f"{LABEL.get(m, m)} {per[m]}/{each}" for m in methods) + ")", "",
             f"| # | method | seed | configuration | time to target (s) | final {metric.label.split()[-1] if metric.name == 'accuracy' else metric.name} | overruns | other processes | flagged | load |",
             "|---:|---|---:|---|---:|---:|---:|---:|---|---|"]
    for k, r in enumerate(done, 1):
        cfg = ", ".join(f"{key} {val}" for key, val in shown_config(r["method"], r["config"]).items())
        t = r.get("time_to_target_s")
        over = r.get("overrun_fraction")
        other = r.get("foreign_busy")  # share of the machine other processes used (FOREIGN_LIMIT)
        lines.append(f"| {k} | {r['method']} | {r['seed']} | {cfg} | {fmt_s(t, budget) if t is not None else '-'} | "
                     f"{metric.fmt(r[metric.final_key])} | {'-' if over is None else f'{100 * over:.2f} %'} | "
                     f"{'-' if other is None else f'{100 * other:.0f} %'} | "
                     f"{'yes' if r.get('flagged') else 'no'} | "
                     + (f"{r['load_start']:.1f}-{r['load_end']:.1f} |" if "load_start" in r else "- |"))
    return "\n".join(lines) + "\n"


STATUS_BEGIN = "<!-- tuning-status: begin (run.py --tuning-status DIR --update-doc FILE writes what is between) -->"
STATUS_END = "<!-- tuning-status: end -->"


def splice_status(doc, status):
    """doc with the text between its tuning-status markers replaced by
    status. A doc without both markers, in that order, exactly once each,
    is refused (ValueError naming what is missing): nothing is appended
    where a reader would not look."""
    for marker in (STATUS_BEGIN, STATUS_END):
        n = doc.count(marker)
        if n != 1:
            raise ValueError(f"the document has the marker {marker!r} {n} times (it needs it once)")
    head, rest = doc.split(STATUS_BEGIN)
    if STATUS_END not in rest:
        raise ValueError(f"the document's {STATUS_END!r} comes before its {STATUS_BEGIN!r}")
    tail = rest.split(STATUS_END)[1]
    return head + STATUS_BEGIN + "\n\n" + status.rstrip("\n") + "\n\n" + STATUS_END + tail


def digest(chosen):
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]


def check_frozen(frozen, test_seeds):
    """A frozen file may be used for test seeds only if none of them was a
    tuning seed and its digest matches its selection."""
    overlap = set(frozen["tuning_seeds"]) & set(test_seeds)
    if overlap:
        raise ValueError(f"test seeds {sorted(overlap)} were tuning seeds: choose others")
    if digest(frozen["chosen"]) != frozen.get("digest"):
        raise ValueError("frozen file: the digest does not match the chosen configurations (edited by hand?)")


# ------------------------------------------------------------------ bytes

def ddp_bytes_per_step(method, tensor_bytes, n, powersgd_bytes=None, averaging=False):
    """Bytes on each rank's up channel (and as many on its down channel) in
    one step of a DDP variant, by the ring all-reduce rule (link.ring_bytes):
    fp32 DDP and speed-proportional batches the fp32 gradient, the fp16 hook
    half of it, PowerSGD its factors (powersgd_bytes: what its all-reduces
    are given in a step), post-local SGD nothing on a local step and the
    fp32 parameters on an averaging one."""
    ring = 0.0 if n <= 1 else 2.0 * (n - 1) / n
    if method in ("ddp", "ddp_propbatch"):
        return ring * tensor_bytes
    if method == "ddp_fp16":
        return ring * tensor_bytes / 2
    if method == "ddp_powersgd":
        if powersgd_bytes is None:
            raise ValueError("ddp_powersgd: powersgd_bytes (the factors' bytes) is needed")
        return ring * powersgd_bytes
    if method == "ddp_localsgd":
        return ring * tensor_bytes if averaging else 0.0
    raise ValueError(f"{method}: not a DDP method")


def powersgd_factor_bytes(shapes, rank, min_compression_rate=2.0, element_bytes=4):
    """What PowerSGD (torch 1.13's powerSGD_hook, after its vanilla start)
    all-reduces in one step for tensors of these shapes: each matrix (a
    tensor viewed as rows x the rest) with (rows + cols) x rank x
    min_compression_rate < rows x cols as its P (rows x rank) and Q
    (cols x rank), the rest (biases, small matrices) as they are."""
    total = 0
    for shape in shapes:
        if len(shape) <= 1:
            total += (shape[0] if shape else 1) * element_bytes
            continue
        rows = shape[0]
        cols = 1
        for d in shape[1:]:
            cols *= d
        r = min(rows, cols, rank)
        if (rows + cols) * r * min_compression_rate < rows * cols:
            total += (rows + cols) * r * element_bytes
        else:
            total += rows * cols * element_bytes
    return total


def propbatch_sizes(compute_factors, workers, total):
    """Per-rank batches proportional to each rank's speed (1 / its compute
    factor), summing to `total` (the global batch of plain DDP): largest
    remainders get the rounding."""
    speed = [1.0 / compute_factors[min(2, r * 3 // workers)] for r in range(workers)]
    s = sum(speed)
    exact = [total * v / s for v in speed]
    out = [int(math.floor(x)) for x in exact]
    for i in sorted(range(workers), key=lambda i: exact[i] - out[i], reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


# ------------------------------------------------------------------ report

def shown_config(method, config):
    """The configuration values that matter to `method` (a row stores them all)."""
    knob = KNOB.get(method) or OUTER_KNOB.get(method)
    keys = ["lr", "warmup_s"] + ([knob] if knob else [])
    keys += {"ddp_powersgd": ["powersgd_start"], "ddp_localsgd": ["localsgd_start"]}.get(method, [])
    return {k: config[k] for k in keys if k in config}


def fmt_s(x, budget):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return f"> {budget:g}"
    return f"{x:.1f}"


def fmt_ratio(r):
    p, lo, hi = r
    if math.isnan(p):
        return "-"
    f = lambda x: "?" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.2f}")
    return f"{f(p)}x [{f(lo)}, {f(hi)}]"


def first_reached(curve, target, metric=ACCURACY):
    """The time of a curve's first tick that reaches `target` (at or above
    it for accuracy, at or below for bits per byte: the protocol's time to
    target), or None; each tick is (seconds, score, ...)."""
    return next((tick[0] for tick in curve if metric.reached(tick[1], target)), None)


def times_of(rows):
    return [math.inf if r["time_to_target_s"] is None else r["time_to_target_s"] for r in rows]


def summarize(rows, target, budget, n_boot=10000, metric=ACCURACY, rivals=DDP_METHODS,
              rival_name="the best DDP variant"):
    """Per method: seeds, median time to target with its interval, median
    final accuracy with its interval, measured and emulated ms per iteration,
    bytes up and down per worker, overrun fraction, flagged runs. The best
    DDP variant (lowest median time on these rows; errs against ashl) and
    ASHL's (and ASHL+'s) ratios to it and to plain DDP, paired by seed.
    rivals: the methods "best_ddp" is chosen from (the language model's
    include the DiLoCo family), rival_name how the report names it. Rows
    with "tokens" (the language model) count tokens, not samples."""
    by = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    out = {"methods": {}, "target": target, "budget": budget}
    if metric is not ACCURACY:
        out.update(metric=metric.name, rival_name=rival_name)
    units = lambda r: r.get("tokens", r["samples"])
    for m in KNOWN_METHODS:
        rs = sorted(by.get(m, []), key=lambda r: r["seed"])
        if not rs:
            continue
        out["methods"][m] = {
            "seeds": [r["seed"] for r in rs],
            "time": bootstrap_ci(times_of(rs), n_boot=n_boot),
            metric.name: bootstrap_ci([r[metric.final_key] for r in rs], n_boot=n_boot),
            "measured_ms": median_of([r["measured_ms_per_iteration"] for r in rs]),
            "emulated_ms": median_of([r["emulated_ms_per_iteration"] for r in rs]),
            "mb_up": median_of([r["bytes_up_per_worker"] for r in rs]) / 1e6,
            "mb_down": median_of([r["bytes_down_per_worker"] for r in rs]) / 1e6,
            "overruns": median_of([r["overrun_fraction"] for r in rs]),
            "samples_per_s": median_of([units(r) / r["budget_s"] for r in rs]),
            "samples_to_target": median_of([units(r) * t / r["budget_s"] for r, t in zip(rs, times_of(rs))]),
            "flagged": sum(1 for r in rs if r.get("flagged")),
            "config": shown_config(m, rs[0].get("config", {})),
        }
    ddps = [m for m in rivals if m in out["methods"]]
    # The fastest to the target; among variants that did not reach it, the best final score.
    best = min(ddps, key=lambda m: (out["methods"][m]["time"][0], metric.rank(out["methods"][m][metric.name][0]), m)) \
        if ddps else None
    out["best_ddp"] = best
    out["ratios"] = {}
    for m in ("ashl", "ashl_plus"):
        if m not in by:
            continue
        for ref_name, ref in (("best_ddp", best), ("ddp", "ddp")):
            if ref is None or ref not in by:
                continue
            a = {r["seed"]: r for r in by[m]}
            b = {r["seed"]: r for r in by[ref]}
            seeds = sorted(set(a) & set(b))
            out["ratios"][f"{m}/{ref_name}"] = paired_ratio_ci(times_of([a[s] for s in seeds]),
                                                               times_of([b[s] for s in seeds]), n_boot=n_boot)
    return out


def metric_of(summary):
    return BITS_PER_BYTE if summary.get("metric") == "bpb" else ACCURACY


def report_table(summary):
    """The markdown of docs/perf/cnn.md's protocol table and its ratio lines."""
    budget, target = summary["budget"], summary["target"]
    metric = metric_of(summary)
    final = "final accuracy" if metric is ACCURACY else f"final {metric.label}"
    lines = [f"| method | tuned | time to {target:.2f} (s), median [95 % CI] | {final}, median [95 % CI] "
             "| ms per iteration, measured / emulated | MB per worker, up / down | overruns | flagged |",
             "|---|---|---|---|---|---|---:|---:|"]
    for m, s in summary["methods"].items():
        t, tl, th = s["time"]
        a, al, ah = s[metric.name]
        cfg = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in s["config"].items())
        best = (" (best DDP)" if metric is ACCURACY else " (best rival)") if m == summary["best_ddp"] else ""
        lines.append(f"| {LABEL[m]}{best} | {cfg} | {fmt_s(t, budget)} [{fmt_s(tl, budget)}, {fmt_s(th, budget)}] "
                     f"| {metric.fmt(a)} [{metric.fmt(al)}, {metric.fmt(ah)}] | {s['measured_ms']:.0f} / {s['emulated_ms']:.0f} "
                     f"| {s['mb_up']:.1f} / {s['mb_down']:.1f} | {100 * s['overruns']:.2f} % "
                     f"| {s['flagged']} of {len(s['seeds'])} |")
    lines.append("")
    lines += ratio_lines(summary)
    return "\n".join(lines) + "\n"


def ratio_lines(summary):
    """ASHL's (and ASHL+'s) ratios to the best DDP variant and to plain DDP, markdown list items."""
    out = []
    for key, r in summary["ratios"].items():
        m, ref = key.split("/")
        rival = summary.get("rival_name", "the best DDP variant")
        ref_label = f"{rival} ({LABEL[summary['best_ddp']]})" if ref == "best_ddp" else "plain DDP"
        out.append(f"- {LABEL[m]} / {ref_label}, time to {summary['target']:.2f}: **{fmt_ratio(r)}**")
    return out


def efficiency_table(summary, ref="ddp"):
    """Where each method's time to target goes, as markdown: its rate (samples
    per second over all workers) and the samples it had seen when it reached
    the target (its run's mean rate times its time to target: an estimate),
    medians over seeds, each also relative to `ref` (plain DDP). A time to
    target is samples-to-target over rate, so a method is faster to the target
    because it trains more samples a second, needs fewer of them, or both."""
    methods = summary["methods"]
    base = methods.get(ref)
    unit = "samples" if metric_of(summary) is ACCURACY else "tokens"
    rel = lambda x, b: "-" if b is None or not math.isfinite(x) or not b > 0 else f"{x / b:.2f}x"
    lines = [f"| method | {unit} per second, all workers | relative to {LABEL[ref]} "
             f"| {unit} seen at {summary['target']:.2f} (thousands) | relative to {LABEL[ref]} |",
             "|---|---:|---:|---:|---:|"]
    for m, s in methods.items():
        rate, seen = s["samples_per_s"], s["samples_to_target"]
        lines.append(f"| {LABEL[m]} | {rate:.0f} | {rel(rate, base and base['samples_per_s'])} "
                     f"| {'not reached' if not math.isfinite(seen) else f'{seen / 1e3:.0f}'} "
                     f"| {rel(seen, base and base['samples_to_target'])} |")
    return "\n".join(lines) + "\n"


def milestone_table(rows, budget, best_ddp, accuracies=None, metric=ACCURACY, rival_name="the best DDP variant"):
    """Median time (s, over seeds) to each of several test accuracies, read
    from the runs' curves, one row a method, then ASHL's ratio of medians to
    plain DDP and to the best DDP variant at each: where along the way a
    method gains or loses time. A curve that never reaches an accuracy counts
    as a miss (> budget), as in the main table. accuracies: the milestones
    (default: the metric's)."""
    if accuracies is None:
        accuracies = metric.milestones

    def at(r, acc):  # a miss is inf, as in times_of
        t = first_reached(r["curve"], acc, metric)
        return math.inf if t is None else t
    med = {}
    for m in KNOWN_METHODS:
        rs = [r for r in rows if r["method"] == m]
        if rs:
            med[m] = [median_of([at(r, acc) for r in rs]) for acc in accuracies]
    lines = ["| method | " + " | ".join(metric.fmt_milestone(acc) for acc in accuracies) + " |",
             "|---|" + "---:|" * len(accuracies)]
    for m, ts in med.items():
        lines.append(f"| {LABEL[m]} | " + " | ".join(fmt_s(t, budget) for t in ts) + " |")
    def ratio(a, b):  # where only the reference missed, the ratio is below ASHL's time over the budget
        if math.isinf(b) and not math.isinf(a):
            return f"< {a / budget:.2f}x"
        r = _ratio(a, b)
        return "-" if math.isnan(r) else f"{r:.2f}x"
    for ref, name in (("ddp", "plain DDP"), (best_ddp, rival_name)):
        if "ashl" in med and ref in med:
            lines.append(f"| ASHL / {name} | " + " | ".join(ratio(a, b) for a, b in zip(med["ashl"], med[ref])) + " |")
    return "\n".join(lines) + "\n"


def per_seed_table(rows, budget):
    """Every run behind the medians, as markdown: one row a method, one
    column a seed, each cell that run's time to target (s), "> budget"
    where it missed, " *" where it was flagged, empty where it did not run."""
    seeds = sorted({r["seed"] for r in rows})
    by = {(r["method"], r["seed"]): r for r in rows}
    lines = ["| method | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|" + "---:|" * len(seeds)]
    for m in KNOWN_METHODS:
        if not any((m, s) in by for s in seeds):
            continue
        cells = []
        for s in seeds:
            r = by.get((m, s))
            if r is None:
                cells.append("")
                continue
            cells.append(fmt_s(times_of([r])[0], budget) + (" *" if r.get("flagged") else ""))
        lines.append(f"| {LABEL[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def median_curves(rows):
    """Per method, its median test accuracy over its runs at each tick all
    of them have: {method: [(seconds, accuracy)]}, in ALL_METHODS order
    (the plot draws one line a method, not one a run)."""
    out = {}
    for m in KNOWN_METHODS:
        runs = [dict((round(t, 3), acc) for t, acc in r["curve"]) for r in rows if r["method"] == m]
        if not runs:
            continue
        ticks = sorted(set.intersection(*(set(c) for c in runs)))
        out[m] = [(t, median_of([c[t] for c in runs])) for t in ticks]
    return out


def goal_verdict(summary, best_goal=None, plain_goal=0.5):
    """The comparison's goal: ASHL <= 0.6x the best DDP variant and <= 0.5x plain
    DDP, each with the interval's upper end below 1 (the language model's:
    0.7x its best rival, docs/lm.md). (met, reasons)."""
    if best_goal is None:
        best_goal = 0.6 if metric_of(summary) is ACCURACY else 0.7
    reasons = []
    r_best = summary["ratios"].get("ashl/best_ddp")
    r_plain = summary["ratios"].get("ashl/ddp")
    if r_best is None or r_plain is None:
        return False, ["ASHL, plain DDP or a DDP variant did not run"]
    best_name = summary.get("rival_name", "the best DDP variant").replace("the ", "", 1)
    for name, r, goal in ((best_name, r_best, best_goal), ("plain DDP", r_plain, plain_goal)):
        p, _, hi = r
        if math.isnan(p):
            reasons.append(f"ASHL / {name}: undefined (neither reached the target in the budget)")
            continue
        if p > goal:
            reasons.append(f"ASHL / {name} = {fmt_ratio(r)}: above {goal}")
        if math.isnan(hi) or hi >= 1.0:
            reasons.append(f"ASHL / {name}: the interval reaches {hi:.2f} (not below 1)")
    return not reasons, reasons


def strict_json(obj):
    """obj as one strict JSON object: NaN (unknown) as null, an infinity (a
    target not reached) as the string "inf", which float() reads back."""
    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, float) and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return json.dumps(clean(obj), allow_nan=False)


def load_summary(text):
    """A summary.json written by --report, its ratios read back as floats (null: NaN, "inf": a miss)."""
    s = json.loads(text)
    s["ratios"] = {k: tuple(math.nan if x is None else float(x) for x in r) for k, r in s["ratios"].items()}
    return s


def protocol_result(summary, where="examples/cnn/protocol-runs/table.md, docs/perf/cnn.md"):
    """The protocol's headline in a few lines: its runs and seeds, ASHL's
    ratios and the goal's verdict (what scripts/demo prints after its own table)."""
    runs = sum(len(m["seeds"]) for m in summary["methods"].values())
    seeds = sorted({x for m in summary["methods"].values() for x in m["seeds"]})
    return "\n".join([f"The full protocol ({runs} runs, seeds {','.join(map(str, seeds))}, {summary['budget']:g} s "
                      f"each; {where}):"]
                     + ratio_lines(summary) + [verdict_text(summary)])


def verdict_text(summary):
    """goal_verdict as the report's sentence."""
    met, why = goal_verdict(summary)
    best = 0.6 if metric_of(summary) is ACCURACY else 0.7
    rival = summary.get("rival_name", "the best DDP variant")
    return (f"Goal (ASHL <= {best:g}x {rival} and <= 0.5x plain DDP, intervals below 1): "
            + ("met" if met else "not met: " + "; ".join(why)))
