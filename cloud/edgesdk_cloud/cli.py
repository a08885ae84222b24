"""The cloud side's ``edgesdk`` commands: ``serve`` and ``export kserve|triton``.

The ``edgesdk`` command finds this module through the ``edgesdk.cli`` entry point of this distribution
(``edgesdk-cloud``) and imports it only to run or list one of its commands; kserve is imported when a server
starts, never here."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .limits import BODY_TIMEOUT_S, MAX_PENDING

app = typer.Typer(help="The cloud side of hybrid mode: serve a bundle, export its deployment.")


@app.command()
def serve(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    artifact: Optional[str] = typer.Option(None, "--artifact", help="Artifact id to serve (default: the most "
                                           "accurate float artifact whose engine is installed)."),
    allow_failed: bool = typer.Option(False, "--allow-failed", help="Serve an --artifact that failed its "
                                      "validation gate at quantize time, with a warning."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="HTTP port."),
    repository_token_env: Optional[str] = typer.Option(None, "--repository-token-env", help="Turn on KServe's "
                                                       "model-repository API (load, unload) for requests carrying "
                                                       "`Authorization: Bearer <value of VAR>`; off without it (the "
                                                       "token must be 16+ characters)."),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Largest batch one request may carry "
                                            "(default: 64, lower for big inputs; required with a dynamic input "
                                            "dimension after the batch)."),
    max_body_bytes: Optional[int] = typer.Option(None, "--max-body-bytes", help="Largest request body in bytes "
                                                 "(default: the model's input values x max batch x 32 + 64 KiB; "
                                                 "required with a dynamic input dimension)."),
    body_timeout: float = typer.Option(BODY_TIMEOUT_S, "--body-timeout", help="Seconds a request body may take "
                                       "to arrive (408 past it)."),
    max_pending: int = typer.Option(MAX_PENDING, "--max-pending", help="Requests held at once (503 with "
                                    "Retry-After past it)."),
    monitor: Optional[Path] = typer.Option(None, "--monitor", help="Watch every answered row as a device's monitor "
                                           "does and append its snapshots and alerts to this JSON-lines file "
                                           "(read it with `edgesdk monitor FILE`)."),
    otel: bool = typer.Option(False, "--otel", help="Export the monitor's figures (the device's OpenTelemetry "
                              "instruments) over OTLP/HTTP, configured by the OTEL_EXPORTER_OTLP_* environment "
                              "variables (needs the otel extra: pip install \"edgesdk-cloud\\[otel]\")."),
) -> None:
    """Host a bundle's model in KServe's ModelServer, over the Open Inference Protocol V2 REST: the cloud side of
    hybrid mode (needs kserve, the serve extra: pip install "edgesdk-cloud\\[serve]"). Runs until interrupted.
    Request limits: see the README's Limits section. A connection whose request headers take over 10 s is closed
    (408), but at most 64 connections are kept, so a client that reconnects as fast as it is cut off can hold them
    all: outside a trusted network, put serve behind an ingress or proxy that bounds connections and header time per
    client (a KServe deployment has one).

    Exits 3 when kserve or the artifact's engine is missing (the reason code is printed)."""
    import os

    from edgesdk.errors import InputError
    from edgesdk_cloud.server import serve as serve_bundle  # without kserve, it refuses naming what to install

    token = None
    if repository_token_env is not None:
        token = os.environ.get(repository_token_env)
        if not token:
            raise InputError(f"--repository-token-env {repository_token_env}: that environment variable is not set")
    serve_bundle(bundle, artifact=artifact, host=host, port=port, allow_failed=allow_failed, repository_token=token,
                 max_batch=max_batch, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout,
                 max_pending=max_pending, monitor_file=monitor, otel=otel)


export_app = typer.Typer(
    help="Write what a cloud deployment of a bundle needs into a new folder (the cloud side of hybrid mode).",
    no_args_is_help=True,
)


app.add_typer(export_app, name="export", help="Write a bundle's cloud deployment: a KServe InferenceService with "
              "its predictor image, or a Triton model repository.")


def _print_export(result, what: str) -> None:
    print(f"{what} (artifact {result.artifact}) written to {result.out}:")
    for entry in result.entries:
        print(f"  {entry}")


@export_app.command("kserve")
def export_kserve(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    out: Path = typer.Argument(..., help="Folder to write (new or empty)."),
    image: Optional[str] = typer.Option(None, "--image", help="Image name for the InferenceService (default: "
                                        "edgesdk-<bundle name>:<bundle version>)."),
    artifact: Optional[str] = typer.Option(None, "--artifact", help="Artifact id to serve (default: the most "
                                           "accurate float artifact)."),
    allow_failed: bool = typer.Option(False, "--allow-failed", help="Export an --artifact that failed its "
                                      "validation gate at quantize time (the image serves it with --allow-failed)."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it holds a previous export."),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Largest batch one request may carry in the "
                                            "served image (default: as edgesdk serve derives it; required with a "
                                            "dynamic input dimension after the batch)."),
    max_body_bytes: Optional[int] = typer.Option(None, "--max-body-bytes", help="Largest request body in bytes in "
                                                 "the served image (default: as edgesdk serve derives it; required "
                                                 "with a dynamic input dimension)."),
) -> None:
    """Write the bundle, a Dockerfile for a KServe predictor image running `edgesdk serve`, inferenceservice.yaml
    (V2 protocol, port 8080, memory sized for the request caps) and a README with the build, push and apply
    commands."""
    from edgesdk_cloud.export import export_kserve as run_export

    result = run_export(bundle, out, image=image, artifact=artifact, force=force, allow_failed=allow_failed,
                        max_batch=max_batch, max_body_bytes=max_body_bytes)
    _print_export(result, "KServe deployment")
    print(f"next: {result.out / 'README.md'} (docker build, docker push, kubectl apply)")


@export_app.command("triton")
def export_triton(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    out: Path = typer.Argument(..., help="Folder to write (new or empty): the Triton model repository."),
    artifact: Optional[str] = typer.Option(None, "--artifact", help="ONNX Runtime artifact id (default: the "
                                           "onnxruntime fp32 artifact)."),
    allow_failed: bool = typer.Option(False, "--allow-failed", help="Export an --artifact that failed its "
                                      "validation gate at quantize time."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it holds a previous export."),
) -> None:
    """Write a Triton model repository: <name>/config.pbtxt (platform onnxruntime_onnx, max_batch_size 0, the
    manifest's shapes under the ONNX file's tensor names) and <name>/1/model.onnx, the bundle's artifact unchanged.
    Needs onnxruntime here, to read those names."""
    from edgesdk_cloud.export import export_triton as run_export

    _print_export(run_export(bundle, out, artifact=artifact, force=force, allow_failed=allow_failed),
                  "Triton model repository")
