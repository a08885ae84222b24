"""One install, step by step (:class:`~edgesdk.choices.InstallStep`, told to the ``progress`` callback before each):
``stage`` a private folder; ``download`` / ``extract`` / ``copy`` the source into it; ``verify`` every file against
the manifest's sha256 and the signature; ``self_check``: load it on this machine (golden inputs run and compared) and
close it; then, under the store's lock, ``publish`` (the folder renamed into ``versions/``), ``rollout`` (does this
device take it?), ``activate`` (the pointer replaced) and ``prune``; ``done``. Why a kill at any of them leaves the
store serving its previous version is told in :mod:`edgesdk.store`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..bundle.reader import Bundle
from ..choices import InstallStep, StoreReason, VersionState
from ..errors import BundleError, EdgeSDKError, InputError, StoreError
from ..trust import Trust
from . import changes, rollout
from .disk import RECORD, VERSIONS, append_history, fsync_dir, sync_tree, write_durable
from .staging import Staging, check_source, describe, fetch
from .versions import StoreVersion, new_record, version_id

if TYPE_CHECKING:
    from .store import BundleStore

Progress = Callable[[str, dict[str, Any]], None]


def install(store: "BundleStore", source: Any, trust: Trust | str | Path | None, rollout_percent: Any,
            progress: Progress | None, allow_rejected: bool) -> StoreVersion:
    """See :meth:`BundleStore.install`."""
    trusts = [t for t in (store.options.trust, _trust(trust)) if t is not None]
    percent = rollout.check_percent(rollout_percent)
    if progress is not None and not callable(progress):
        raise InputError(f"progress must be a callable(step, detail) or None, got {type(progress).__name__}")
    if not isinstance(allow_rejected, bool):
        raise InputError(f"allow_rejected must be True or False, got {allow_rejected!r}")
    check_source(source)
    shown = describe(source)

    def report(step: str, detail: dict[str, Any]) -> None:
        if progress is not None:
            progress(step, detail)

    with store._locked():  # made and locked under the store's lock: another process's recovery, which deletes the
        staging = Staging(store.root)  # staging folders nobody holds, never sees it unheld
    try:
        report(InstallStep.STAGE, {"source": shown})
        try:
            folder = fetch(source, store.root, staging.path, store.options, report)
        except EdgeSDKError as exc:  # recorded: why an update did not happen is the first question asked
            append_history(store.root, "failed", None, f"{type(exc).__name__}: {exc}", source=shown)
            raise
        report(InstallStep.VERIFY, {"signature": bool(trusts)})
        try:
            bundle = Bundle.open(folder)  # every file against the manifest's sha256
            for t in trusts:
                t.check(folder)
        except BundleError as exc:  # named by its source, not by the staging folder
            refusal = BundleError(str(exc).replace(str(folder), shown))
            append_history(store.root, "refused", None, str(refusal), source=shown)
            raise refusal from exc
        version = version_id(bundle.manifest)
        _refuse_rejected(store, version, allow_rejected)
        if percent is None:
            percent = rollout.check_percent(bundle.manifest.get("rollout_percent"), "the manifest's rollout_percent")
        report(InstallStep.SELF_CHECK, {"version": version})
        check = _self_check(store, folder, version)
        report(InstallStep.SELF_CHECK, {"version": version, "passed": True, **check})
        record = new_record(version, bundle.manifest, shown, percent, bool(trusts), check)
        sync_tree(staging.path)
        write_durable(staging.path / RECORD, json.dumps(record, indent=1))  # last: the folder is now complete
        return _publish(store, staging.path, version, record, report)
    finally:
        staging.close()


def _trust(trust: Trust | str | Path | None) -> Trust | None:
    if trust is None or isinstance(trust, Trust):
        return trust
    if isinstance(trust, (str, Path)):
        return Trust(public_key=trust)
    raise InputError(f"trust must be an edgesdk.Trust, a public key path or None, got {type(trust).__name__}")


def _refuse_rejected(store: "BundleStore", version: str, allow_rejected: bool) -> None:
    state = store._pointer().states.get(version) or {}
    if state.get("state") == VersionState.REJECTED and not allow_rejected:
        raise StoreError(StoreReason.REJECTED_BEFORE,
                         f"version {version} was rejected by store {store.root} ({state.get('reason')}); it is "
                         f"installed again only with allow_rejected=True (CLI --allow-rejected) ({store.state_text()})")


def _self_check(store: "BundleStore", folder: Path, version: str) -> dict[str, Any]:
    """Load the staged bundle as the store's self-check options say, and close it; refuse it (recorded as rejected)
    when it does not load, or loads with nothing checking its numerics while ``require_golden``."""
    from ..runtime.loading import load

    try:
        model = load(folder, store.options.self_check)
    except EdgeSDKError as exc:
        why = f"{StoreReason.SELF_CHECK_FAILED}: {type(exc).__name__}: {exc}"
        store._reject(version, why)
        raise StoreError(StoreReason.SELF_CHECK_FAILED,
                         f"version {version} failed its self-check on this machine and is not activated "
                         f"({type(exc).__name__}: {exc}) ({store.state_text()})") from exc
    with model:
        placement = model.placement
        numerics = dict(placement.numerics)
    if store.options.require_golden and not numerics.get("checked"):
        why = f"{StoreReason.NOT_CHECKED}: nothing checked its numerics here ({numerics.get('why')})"
        store._reject(version, why)
        raise StoreError(StoreReason.NOT_CHECKED, f"version {version} loaded, but nothing checked its numerics on this "
                                                  f"machine ({numerics.get('why')}); a store activates only checked "
                                                  "versions (StoreOptions(require_golden=False) lets it) "
                                                  f"({store.state_text()})")
    return {"artifact": placement.artifact, "engine": placement.engine, "device": placement.device,
            "max_abs_error": numerics.get("max_abs_error")}


def _publish(store: "BundleStore", staged: Path, version: str, record: dict[str, Any],
             report: Progress) -> StoreVersion:
    """Under the lock: move the complete folder into ``versions/``, decide the rollout, activate or stage, prune."""
    root = store.root
    with store._locked():
        report(InstallStep.PUBLISH, {"version": version})
        target = root / VERSIONS / version
        pointer = store._pointer()
        if target.exists() and version not in pointer.referenced():  # a leftover the recovery would remove
            store._discard(target)
        if not target.exists():
            staged.rename(target)
            fsync_dir(target.parent)
        decision = rollout.decide(store.device_id, version, record["rollout_percent"])
        report(InstallStep.ROLLOUT, {"version": version, **decision})
        if version == pointer.active:
            append_history(root, "installed", version, "already active")
        elif not decision["selected"] and version in pointer.previous:  # as _reject: a kept version is not staged
            # (a staged record would let a prune delete the folder that rollback needs)
            append_history(root, "installed", version, "already kept as a previous version; this device is outside "
                           "its rollout, so it stays one")
        elif not decision["selected"]:
            why = (f"{StoreReason.NOT_IN_ROLLOUT}: this device's bucket {decision['bucket']:.2f} is not under "
                   f"rollout_percent {decision['percent']:g}")
            pointer.remember(version, VersionState.STAGED, why, folder=True)
            store._commit(pointer)
            append_history(root, "staged", version, why, bucket=decision["bucket"], percent=decision["percent"])
        else:
            report(InstallStep.ACTIVATE, {"version": version, "from": pointer.active})
            old = changes.activate(pointer, version, store.options.probation)
            store._commit(pointer, before_replace=lambda: report(InstallStep.ACTIVATE,
                                                                {"version": version, "pointer": "written"}))
            append_history(root, "activated", version, "installed", previous=old, source=record["source"])
            store._changed("activated", version, old, "installed")
            store._prune(pointer, report)
    report(InstallStep.DONE, {"version": version})
    return store.version(version)


__all__ = ["install"]
