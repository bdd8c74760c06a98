"""Hyperparameter sweeps, Optuna's (`mini-gpt sweep`, docs/sweeps.md) and Hydra's multirun: trials.csv."""

from __future__ import annotations

import contextlib
import csv
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from filelock import FileLock
from hydra.experimental.callback import Callback as HydraCallback
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig, OmegaConf

from mini_gpt.conf import checked_config
from mini_gpt.conf.train import StudySettings
from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.files import read_json, write_json_atomic
from mini_gpt.train.distributed import devices_per_node, refuse_multirun_devices

if TYPE_CHECKING:
    import lightning as L
    import optuna

TABLE_FILE = "trials.csv"


def require_optuna() -> None:
    missing = 'mini-gpt sweep needs Optuna, which is not installed; run pip install -e ".[sweep]"'
    import_extra("optuna", missing)


def study_settings(cfg: DictConfig) -> StudySettings:
    """The composed config's `hparams_search` node, checked."""
    if (node := cfg.get("hparams_search")) is None:
        raise MiniGPTError(
            "mini-gpt sweep needs a search space: add hparams_search=lr_search (or your own "
            "conf/hparams_search/NAME.yaml)"
        )
    return checked_config(StudySettings, OmegaConf.to_container(node, resolve=True), "hparams_search")  # type: ignore[arg-type]


def distribution(key: str, spec: str) -> optuna.distributions.BaseDistribution:
    """An Optuna distribution from Hydra's sweep grammar (`range`'s end excluded, as in Python)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    try:
        value = OverridesParser.create().parse_override(f"{key}={spec}").value()
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MiniGPTError(f"hparams_search.params.{key}={spec!r} is not sweep syntax ({reason})") from None
    log = "log" in getattr(value, "tags", set())
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        if isinstance(low, int) and isinstance(high, int) and not isinstance(spec, float):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    if isinstance(value, RangeSweep):
        start, step = int(value.start), int(value.step or 1)
        last = start + (int(value.stop) - 1 - start) // step * step  # range's last value
        return IntDistribution(start, last, step=step, log=log)
    if isinstance(value, ChoiceSweep):
        return CategoricalDistribution(value.list)
    raise MiniGPTError(
        f"hparams_search.params.{key}={spec!r} must be interval(...), tag(log, interval(...)), range(...) "
        "or choice(...)"
    )


def searched_params(settings: StudySettings, cfg: DictConfig) -> dict[str, Any]:
    """The params this config searches; `when` drops another optimizer's (optim.muon_lr under adamw)."""
    space = {}
    for key, spec in settings.params.items():
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>":
            raise MiniGPTError(f"hparams_search.params.{key}: the train config has no key {key}")
        other, _, want = settings.when.get(key, "").partition("=")
        if other and str(OmegaConf.select(cfg, other, default=None)) != want:
            continue
        space[key] = distribution(key, spec)
    return space


@contextlib.contextmanager
def _experimental() -> Iterator[None]:
    """Quiet Optuna's ExperimentalWarning on heartbeats and stale-trial retries (unchanged since 2.9)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _storage(settings: StudySettings) -> Any:
    """None (in memory), a database URL, or a journal file (safe on NFS)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    if settings.storage is None:
        return None
    if "://" in settings.storage:
        if settings.storage.startswith("sqlite:///"):
            Path(settings.storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        with _experimental():
            return optuna.storages.RDBStorage(
                settings.storage, heartbeat_interval=settings.heartbeat_interval,
                grace_period=settings.grace_period,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
            )  # fmt: skip
    path = Path(settings.storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    backend = JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path)))
    return optuna.storages.JournalStorage(backend)


PRUNERS = {"median": "MedianPruner", "successive_halving": "SuccessiveHalvingPruner", "none": "NopPruner"}


def make_pruner(node: dict[str, Any]) -> optuna.pruners.BasePruner:
    import optuna

    name = node.get("name", "none")
    if name not in PRUNERS:
        raise MiniGPTError(f"hparams_search.pruner.name={name!r} must be one of {', '.join(PRUNERS)}")
    try:
        return getattr(optuna.pruners, PRUNERS[name])(**(node.get(name) or {}))
    except (TypeError, ValueError) as err:
        raise MiniGPTError(f"bad hparams_search.pruner.{name} ({err})") from None


# Fixed overrides that do not change what a trial trains: a study continues across them.
NOT_TRAINING = ("hparams_search", "paths.", "logger", "hydra.", "trainer.enable_progress_bar",
                "data.data_dir")  # fmt: skip


def open_study(settings: StudySettings, space: dict[str, Any], fixed: Sequence[str] = ()) -> optuna.Study:
    """Create or load the study; refuse a stored one of another search space or other fixed overrides."""
    import optuna
    from hydra.utils import instantiate

    Path(settings.dir).mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    described = {k: optuna.distributions.distribution_to_json(d) for k, d in sorted(space.items())}
    # Workers starting at once would each create the database's tables (and fail): one at a time.
    with FileLock(str(Path(settings.dir) / ".study.lock")):
        study = optuna.create_study(
            study_name=settings.study_name, storage=_storage(settings), direction=settings.direction,
            sampler=instantiate(settings.sampler) if settings.sampler else None,
            pruner=make_pruner(settings.pruner), load_if_exists=True,
        )  # fmt: skip
        # the fixed overrides that decide what every trial trains (sorted; `+key=` as `key=`)
        trains = sorted(o.lstrip("+") for o in fixed if not o.lstrip("+").startswith(NOT_TRAINING))
        stored, stored_trains = (study.user_attrs.get(key) for key in ("search_space", "fixed_overrides"))
        if stored is None:
            study.set_user_attr("search_space", described)
        if stored_trains is None:
            study.set_user_attr("fixed_overrides", trains)
    if stored is not None and stored != described:
        raise MiniGPTError(
            f"the study {settings.study_name!r} in {settings.storage} searches {', '.join(stored)}, not "
            f"{', '.join(described)}: give this search space its own hparams_search.study_name or storage"
        )
    if stored_trains is not None and stored_trains != trains:
        raise MiniGPTError(
            f"the study {settings.study_name!r} in {settings.storage} trains its trials with "
            f"{' '.join(stored_trains) or 'no fixed overrides'}, not {' '.join(trains) or 'none'}: give this "
            "sweep its own hparams_search.study_name, or repeat those overrides to continue the study"
        )
    return study


class ReportValLoss(Callback):
    """Reports val/loss at each validation's optimizer step; stops the fit when the trial is pruned.
    (optuna-integration's callback reports per epoch, and a mini-gpt run is one long epoch.)"""

    def __init__(self, trial: optuna.Trial, monitor: str = "val/loss") -> None:
        self.trial, self.monitor = trial, monitor
        self.pruned_at: int | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or value is None or not math.isfinite(float(value)):
            return
        self.trial.report(float(value), step=trainer.global_step)
        if trainer.global_step > 0 and self.trial.should_prune():
            self.pruned_at = trainer.global_step
            trainer.should_stop = True


def _suggest(trial: optuna.Trial, key: str, d: Any) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    if isinstance(d, FloatDistribution):
        return trial.suggest_float(key, d.low, d.high, log=d.log, step=d.step)
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(key, d.choices)
    return trial.suggest_int(key, d.low, d.high, step=d.step, log=d.log)


def _param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _finished(study: optuna.Study) -> int:
    """Trials that count towards n_trials: completed, pruned, or failed and not retried, plus the ones
    running or waiting now (other workers'), so that workers together stop at n_trials."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    with _experimental():
        retried = {RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials}
    return sum(1 for t in trials if not (t.state == TrialState.FAIL and t.number in retried))


def wandb_trial_names(cfg: DictConfig, number: int) -> list[str]:
    """W&B: one run per trial (`trial-<n>`), grouped per study, unless the user named them."""
    if (wandb := OmegaConf.select(cfg, "logger.wandb")) is None:
        return []
    ours = {"name": f"trial-{number}", "group": f"sweep-{cfg.hparams_search.study_name}"}
    return [f"logger.wandb.{key}={value}" for key, value in ours.items() if wandb.get(key) is None]


def run_study(
    settings: StudySettings, compose: Callable[[Sequence[str]], DictConfig], fixed: Sequence[str],
    train_trial: Callable[[DictConfig, Sequence[Callback]], dict[str, Any] | None],
) -> optuna.Study:  # fmt: skip
    """Run trials until the study has `n_trials` (all workers); `train_trial`: a summary, None: failed."""
    import optuna
    from hydra.utils import instantiate

    base = compose(fixed)
    space = searched_params(settings, base)
    study = open_study(settings, space, fixed)
    sweep_dir = Path(settings.dir)  # made by open_study
    # Counting the study's trials and creating the next one is one step under this lock: two workers
    # that both see n_trials - 1 trials would otherwise both start one (n_trials + 1 in all).
    ask_lock = FileLock(sweep_dir / ".next-trial.lock")

    def objective(trial: optuna.Trial) -> float:
        ask_lock.release()  # the trial is in the storage now, so the next worker's count includes it
        # seed + trial number: reproducible with one worker, and parallel workers never draw the same values
        if settings.sampler.get("seed") is not None:
            study.sampler = instantiate({**settings.sampler, "seed": settings.sampler["seed"] + trial.number})
        values = {key: _suggest(trial, key, d) for key, d in space.items()}
        overrides = [f"{k}={v!r}" for k, v in values.items()]  # exactly what Optuna records
        trial_dir = sweep_dir / str(trial.number)
        shown = " ".join(f"{k}={_param(v)}" for k, v in values.items())
        print(f"trial {trial.number}: {shown} -> {trial_dir}", flush=True)
        where = [f"paths.run_dir={trial_dir}", *wandb_trial_names(base, trial.number)]
        cfg = compose([*fixed, *overrides, *where])
        hydra_dir = trial_dir / ".hydra"  # where Hydra keeps them, for `mini-gpt compare` and the table
        hydra_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, hydra_dir / "config.yaml")
        (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump([*fixed, *overrides]))
        report = ReportValLoss(trial)
        summary = train_trial(cfg, [report])
        if summary is None:
            raise MiniGPTError(f"trial {trial.number} failed (see {trial_dir / 'train.log'})")
        if report.pruned_at is not None:
            write_json_atomic(trial_dir / "summary.json", {**summary, "status": "pruned"}, indent=2)
            raise optuna.TrialPruned(f"pruned at step {report.pruned_at}")
        loss = summary.get("best_val_loss")
        return float(loss) if loss is not None and math.isfinite(loss) else math.inf

    def run_one_trial() -> bool:
        ask_lock.acquire()
        try:
            waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
            if not waiting and _finished(study) >= settings.n_trials:  # a queued retry still runs
                return False
            study.optimize(objective, n_trials=1, catch=(MiniGPTError,), gc_after_trial=True)
            return True
        finally:
            if ask_lock.is_locked:  # objective() never started
                ask_lock.release()

    while True:
        with _experimental():
            optuna.storages.fail_stale_trials(study)  # a killed worker's trial: FAIL, and a retry is queued
        while run_one_trial():
            pass
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        # a journal file (no heartbeat) cannot tell killed trials from live ones
        if not running or "://" not in (settings.storage or ""):
            return study
        # Other workers' trials, or a killed one whose heartbeat is not stale yet: wait, then retry it here.
        print(f"waiting for running trial(s) {', '.join(str(t.number) for t in running)}", flush=True)
        time.sleep(settings.heartbeat_interval)


# ---- Hydra multirun ---------------------------------------------------------------------------------
class SweepReport(HydraCallback):
    """Hydra callback: refuse an impossible strategy before the first trial; the table after the last."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "trainer" not in config:  # another tool's multirun
            return
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        trainer = config.trainer
        world = devices_per_node(trainer.accelerator, trainer.devices) * trainer.num_nodes
        try:  # a cluster launcher (SLURM) starts the ranks itself
            refuse_multirun_devices(world, external="submitit" in launcher.lower(), devices=trainer.devices)
        except MiniGPTError as err:  # before any trial: one line, nothing started
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if "trainer" not in config or not sweep_dir.is_dir():
            return
        if rows := read_trials(sweep_dir):
            report_table(sweep_dir, *trials_table(rows), title=str(sweep_dir))


# ---- the table of trials ----------------------------------------------------------------------------
def _error_line(trial_dir: Path) -> str:
    """The reason a trial failed, from its train.log: the `error:` line, else the last line."""
    log = trial_dir / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return ([line for line in lines if line.startswith("error:")] or lines or ["no train.log"])[-1]


def read_trials(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """One row per trial directory `<sweep dir>/<n>/`, in trial order."""
    rows = []
    trial_dirs = [d for d in Path(sweep_dir).iterdir() if d.is_dir() and d.name.isdigit()]
    for trial_dir in sorted(trial_dirs, key=lambda d: int(d.name)):
        overrides_file = trial_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
        summary = read_json(trial_dir / "summary.json") or {}
        status = summary.get("status", "failed")
        pairs = dict(o.split("=", 1) for o in overrides or [] if "=" in o)
        row = {"trial": int(trial_dir.name), "overrides": pairs, "status": status}
        row |= {k: summary.get(k) for k in ("best_val_loss", "wall_seconds", "steps")}
        rows.append({**row, "error": "" if status == "completed" else _error_line(trial_dir)})
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def trials_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a multirun's table: a column per override that varies (all for one trial)."""
    keys = list(dict.fromkeys(k for row in rows for k in row["overrides"]))
    if len(rows) > 1:
        keys = [k for k in keys if len({row["overrides"].get(k) for row in rows}) > 1]
    header = ["trial", *keys, "status", "best_val_loss", "wall_seconds", "steps", "error"]
    body = []
    for row in rows:
        overrides = (row["overrides"].get(k, "-") for k in keys)
        numbers = [_fmt(row["best_val_loss"]), _seconds(row["wall_seconds"]), _fmt(row["steps"])]
        body.append([str(row["trial"]), *overrides, row["status"], *numbers, row["error"]])
    return header, body


def study_table(study: optuna.Study, sweep_dir: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of an Optuna study's trials: params with 4 significant digits, best marked."""
    trials = study.get_trials(deepcopy=False)
    keys = sorted({k for t in trials for k in t.params})
    best = study.best_trial.number if any(t.state.name == "COMPLETE" for t in trials) else None
    header = ["trial", *keys, "state", "best_val_loss", "steps", "wall_seconds", "best"]
    body = []
    for t in trials:
        summary = read_json(sweep_dir / str(t.number) / "summary.json") or {}
        params = (_param(t.params.get(k, "-")) for k in keys)
        numbers = [_fmt(t.value), _fmt(summary.get("steps")), _seconds(summary.get("wall_seconds"))]
        body.append([str(t.number), *params, t.state.name.lower(), *numbers, "*" if t.number == best else ""])
    return header, body


def report_table(sweep_dir: Path, header: list[str], body: list[list[str]], title: str) -> Path:
    """Write the table to `<sweep_dir>/trials.csv` and print it; the CSV's path."""
    path = sweep_dir / TABLE_FILE
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *body])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header) - 1)]  # the last: ragged
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in [header, *body]]
    print(f"\ntrials of {title} (also in {path}):\n" + "\n".join(lines), flush=True)
    return path
