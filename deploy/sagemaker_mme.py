"""mmserver on an Amazon SageMaker multi-model endpoint, step by step, with boto3 alone.

Each step is one function around the boto3 call it makes, so the request SageMaker
receives can be read here (and is checked offline by tests/test_sagemaker_deploy.py):

``package``    model folders -> ``NAME.tar.gz``, the folder's files at the archive's root
``upload``     ``s3.upload_file`` to ``s3://BUCKET/PREFIX/NAME.tar.gz``, one object a model
``deploy``     ``create_model`` (``Mode: MultiModel``), ``create_endpoint_config``,
               ``create_endpoint``, then the ``endpoint_in_service`` waiter
``invoke``     ``sagemaker-runtime`` ``invoke_endpoint(TargetModel="NAME.tar.gz")``
``autoscale``  ``register_scalable_target`` and a target-tracking ``put_scaling_policy`` on
               ``SageMakerVariantInvocationsPerInstance``

The image itself is built and pushed with ``docker build``/``docker push`` (README, "From
one machine to many"); AWS credentials and the region come from boto3's usual chain
(environment, ``~/.aws``, an instance role) or ``--region``. Nothing here signs in.

``package`` needs no AWS library; the other steps import boto3 when they run.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import stat
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ARCHIVE_SUFFIX = ".tar.gz"
DEFAULT_VARIANT = "AllTraffic"
#: A CPU type: AWS documents multi-model endpoints on GPU instances for its Triton container only.
DEFAULT_INSTANCE_TYPE = "ml.m5.xlarge"
#: SageMaker answers invoke_endpoint within 60 s; botocore's default read timeout is also 60 s,
#: which would cut a cold load's answer off at the very moment it arrives.
RUNTIME_READ_TIMEOUT_SECONDS = 70
#: AWS: a model still loading after the 60 s answer keeps loading for up to 360 s.
DEFAULT_READY_TIMEOUT_SECONDS = 360.0
#: Folders a model folder may hold that are the interpreter's, not the model's.
SKIPPED_FOLDERS = frozenset({"__pycache__"})
#: What mmserver loads from the top of a model folder (mmserver/handler/folder.py).
MODEL_FILES = ("model.pt", "model.pt2")
MODEL_SUFFIXES = (".pt", ".pth")
CODE_FOLDER = "code"
#: Variables the image or SageMaker sets, each with what a different value would break.
RESERVED_ENV = {
    "MMSERVER_HOST": "the image binds 0.0.0.0; anything else is unreachable from SageMaker",
    "MMSERVER_MODEL_ROOTS": "SageMaker unpacks models under /opt/ml/models, the image's root",
    "SAGEMAKER_BIND_TO_PORT": "SageMaker sets the port itself",
    "SAGEMAKER_MULTI_MODEL": "a multi-model endpoint needs the multi-model routes",
    "MMSERVER_MANAGEMENT_TOKEN": "SageMaker's POST /models sends no token, so every load "
                                 "would answer 401",
}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ENV_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DeployError(Exception):
    """A refusal with a message for the person at the terminal (exit status 2)."""


# -- package -------------------------------------------------------------------------


def archive_members(model_dir: Path) -> list[tuple[str, Path]]:
    """(name in the archive, file on disk) for every entry of ``model_dir``, sorted.

    Names are relative to the folder (``model.pt``, ``code``, ``code/inference.py``):
    SageMaker unpacks a multi-model archive into the folder it passes to ``POST /models``
    as ``url``, so a top folder in the archive would hide the model one level down.

    A symlink to a file inside the folder is archived as that file's contents, because a
    link's target is a path of this machine that need not exist where the archive is
    unpacked. Refused: a symlink resolving outside the folder (it would ship a file from
    elsewhere on this machine, which mmserver's model roots exist to refuse), a symlinked
    folder, and anything that is not a regular file or a folder (sockets, FIFOs, devices).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise DeployError(f"{model_dir} is not a folder")
    real_root = Path(os.path.realpath(model_dir))
    members: list[tuple[str, Path]] = []
    for folder, subfolders, files in os.walk(model_dir):
        subfolders[:] = sorted(name for name in subfolders if name not in SKIPPED_FOLDERS)
        for name in [*subfolders, *files]:
            path = Path(folder) / name
            relative = path.relative_to(model_dir).as_posix()
            if path.is_symlink():
                target = Path(os.path.realpath(path))
                if not target.is_relative_to(real_root):
                    raise DeployError(f"{relative} in {model_dir} is a symlink to {target}, "
                                      "outside the model folder; copy the file in instead")
                if not target.exists():
                    raise DeployError(f"{relative} in {model_dir} is a symlink to {target}, "
                                      "which does not exist")
                if target.is_dir():
                    raise DeployError(f"{relative} in {model_dir} is a symlinked folder; "
                                      "copy the folder in instead")
            mode = os.stat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise DeployError(f"{relative} in {model_dir} is not a regular file")
            members.append((relative, path))
    _check_model_folder(model_dir, members)
    return sorted(members)


def _check_model_folder(model_dir: Path, members: Sequence[tuple[str, Path]]) -> None:
    """Refuse a folder mmserver would find nothing to load in, before it reaches S3.

    The usual slip is packaging the folder above the model (``examples/tabular`` for
    ``examples/tabular/model``); SageMaker would only say so at the first invocation.
    """
    top = {name for name, _ in members if "/" not in name}
    if (top & set(MODEL_FILES) or any(name.endswith(MODEL_SUFFIXES) for name in top)
            or CODE_FOLDER in top):
        return
    below = sorted(name.split("/")[0] for name, _ in members
                   if name.count("/") == 1 and (name.split("/")[1] in MODEL_FILES
                                                or name.split("/")[1] == CODE_FOLDER))
    hint = f"; did you mean {model_dir / below[0]}?" if below else ""
    raise DeployError(f"{model_dir} holds no {', '.join(MODEL_FILES)}, *.pt/*.pth or "
                      f"{CODE_FOLDER}/ at its top{hint}")


def _tar_info(name: str, path: Path) -> tarfile.TarInfo:
    """One member with no owner of this machine and modes the image's uid 1000 can read."""
    info = tarfile.TarInfo(name)
    status = os.stat(path)
    info.mtime = int(status.st_mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISDIR(status.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.type, info.size = tarfile.REGTYPE, status.st_size
        info.mode = 0o755 if status.st_mode & stat.S_IXUSR else 0o644
    return info


def package_model(model_dir: Path, out_dir: Path, name: str | None = None) -> Path:
    """Write ``out_dir/NAME.tar.gz`` from ``model_dir`` (NAME: the folder's name by default).

    ``NAME.tar.gz`` becomes the S3 key under the prefix and the ``TargetModel`` clients
    send. The gzip header carries no time, so the same files give the same bytes.
    """
    model_dir = Path(model_dir)
    name = model_dir.resolve().name if name is None else name
    check_name(name)
    members = archive_members(model_dir)
    out_dir = Path(out_dir)
    archive = out_dir / f"{name}{ARCHIVE_SUFFIX}"
    if Path(os.path.realpath(out_dir)).is_relative_to(os.path.realpath(model_dir)):
        raise DeployError(f"the archive {archive} would be written inside {model_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    try:
        with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", filename="",
                                                       mtime=0) as zipped, \
                tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for member_name, path in members:
                info = _tar_info(member_name, path)
                if info.isdir():
                    tar.addfile(info)
                else:
                    with open(path, "rb") as content:
                        tar.addfile(info, content)
        partial.replace(archive)
    finally:
        partial.unlink(missing_ok=True)
    return archive


def check_name(name: str) -> None:
    """A model name is an S3 key's last part and a TargetModel: letters, digits, ``._-``."""
    if not NAME_PATTERN.fullmatch(name) or name.endswith(ARCHIVE_SUFFIX):
        raise DeployError(f"model name {name!r}: use letters, digits, '.', '_' and '-', "
                          f"starting with a letter or digit, without {ARCHIVE_SUFFIX}")


def parse_model_folder(spec: str) -> tuple[str | None, Path]:
    """``NAME=DIR`` or ``DIR`` (the name is then the folder's own)."""
    name, sep, folder = spec.partition("=")
    return (name, Path(folder)) if sep else (None, Path(spec))


# -- upload --------------------------------------------------------------------------


def parse_s3_prefix(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX/`` -> (BUCKET, PREFIX without slashes at either end).

    The prefix may not be empty: every object under it can be invoked as a TargetModel,
    so a bucket's root would expose whatever else the bucket holds.
    """
    match = re.fullmatch(r"s3://([^/]+)/(.*)", url)
    prefix = match.group(2).strip("/") if match else ""
    if not match or not prefix:
        raise DeployError(f"{url!r} is not s3://BUCKET/PREFIX/ with a non-empty PREFIX")
    return match.group(1), prefix


def model_data_url(bucket: str, prefix: str) -> str:
    """The ``ModelDataUrl`` of a multi-model endpoint: the prefix, ending in ``/``."""
    return f"s3://{bucket}/{prefix}/"


def upload_archives(s3, archives: Iterable[Path], bucket: str, prefix: str, *,
                    overwrite: bool = False) -> list[str]:
    """``s3.upload_file`` each archive to ``PREFIX/NAME.tar.gz``; the keys, in order.

    An existing key is refused unless ``overwrite``: AWS advises a new name for a new
    version, since instances that hold the old one keep serving it. ``head_object`` asks
    first. The upload carries a SHA-256 checksum, which S3 verifies and keeps.
    """
    from botocore.exceptions import ClientError

    keys = []
    for archive in archives:
        archive = Path(archive)
        if not archive.name.endswith(ARCHIVE_SUFFIX):
            raise DeployError(f"{archive} is not a {ARCHIVE_SUFFIX} archive")
        key = f"{prefix}/{archive.name}"
        if not overwrite:
            try:
                s3.head_object(Bucket=bucket, Key=key)
            except ClientError as error:
                if error.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
                    raise
            else:
                raise DeployError(f"s3://{bucket}/{key} exists; upload the new version under "
                                  "a new name (or pass --overwrite)")
        s3.upload_file(str(archive), bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"})
        keys.append(key)
    return keys


# -- deploy --------------------------------------------------------------------------


def parse_env(pairs: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs -> the container's ``Environment``, refusing what would break it."""
    environment: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_KEY_PATTERN.fullmatch(key):
            raise DeployError(f"--env {pair!r} is not KEY=VALUE")
        if key in RESERVED_ENV:
            raise DeployError(f"--env {key}: {RESERVED_ENV[key]}")
        if key in environment:
            raise DeployError(f"--env {key} is given twice")
        environment[key] = value
    return environment


def create_model(sagemaker, model_name: str, image: str, model_data: str, role_arn: str,
                 environment: Mapping[str, str]) -> str:
    """``create_model`` in ``MultiModel`` mode; the model's ARN.

    ``ModelDataUrl`` is the S3 prefix, not one archive: SageMaker fetches
    ``ModelDataUrl + TargetModel`` when a model is first invoked on an instance. The role
    is the one SageMaker assumes to pull the image from ECR and read the prefix.
    """
    answer = sagemaker.create_model(
        ModelName=model_name,
        ExecutionRoleArn=role_arn,
        PrimaryContainer={
            "Image": image,
            "Mode": "MultiModel",
            "ModelDataUrl": model_data,
            "Environment": dict(environment),
        },
    )
    return answer["ModelArn"]


def create_endpoint_config(sagemaker, config_name: str, model_name: str, instance_type: str,
                           instance_count: int, variant: str = DEFAULT_VARIANT) -> str:
    """``create_endpoint_config`` with one variant: every instance runs the same container."""
    answer = sagemaker.create_endpoint_config(
        EndpointConfigName=config_name,
        ProductionVariants=[{
            "VariantName": variant,
            "ModelName": model_name,
            "InstanceType": instance_type,
            "InitialInstanceCount": instance_count,
        }],
    )
    return answer["EndpointConfigArn"]


def create_endpoint(sagemaker, endpoint_name: str, config_name: str) -> str:
    """``create_endpoint``: SageMaker starts the instances; this returns before they run."""
    return sagemaker.create_endpoint(EndpointName=endpoint_name,
                                     EndpointConfigName=config_name)["EndpointArn"]


def wait_in_service(sagemaker, endpoint_name: str, *, delay: int = 30,
                    max_attempts: int = 120) -> None:
    """boto3's ``endpoint_in_service`` waiter: ``describe_endpoint`` every ``delay`` s.

    The waiter stops as soon as the endpoint reports ``Failed``; its ``FailureReason`` is
    passed on, since it is what says whether the image, the role or the container failed
    (the container's own log is in CloudWatch).
    """
    from botocore.exceptions import WaiterError

    try:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=endpoint_name,
            WaiterConfig={"Delay": delay, "MaxAttempts": max_attempts})
    except WaiterError as error:
        last = error.last_response or {}
        raise DeployError(f"endpoint {endpoint_name} is not InService "
                          f"({last.get('EndpointStatus', 'no status')}): "
                          f"{last.get('FailureReason') or error}") from None


# -- invoke --------------------------------------------------------------------------


def invoke(runtime, endpoint_name: str, target_model: str, body: bytes, *,
           content_type: str = "application/json", accept: str = "application/json",
           ready_timeout: float = DEFAULT_READY_TIMEOUT_SECONDS,
           sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> tuple[str, bytes]:
    """``invoke_endpoint`` on one model of the endpoint: (content type, body) of its answer.

    ``TargetModel`` is the archive's key relative to the prefix (``tabular.tar.gz``). The
    first call for a model on an instance downloads and loads it; past 60 s SageMaker
    answers ``ModelNotReadyException`` while the load goes on, so that answer is retried,
    with growing pauses, until ``ready_timeout`` seconds have passed.
    """
    deadline = clock() + ready_timeout
    pause = 1.0
    while True:
        try:
            answer = runtime.invoke_endpoint(EndpointName=endpoint_name,
                                             TargetModel=target_model,
                                             ContentType=content_type, Accept=accept,
                                             Body=body)
        except runtime.exceptions.ModelNotReadyException:
            if clock() + pause > deadline:
                raise
            sleep(pause)
            pause = min(pause * 2, 30.0)
            continue
        return answer.get("ContentType", ""), answer["Body"].read()


# -- autoscale -----------------------------------------------------------------------


def variant_resource_id(endpoint_name: str, variant: str = DEFAULT_VARIANT) -> str:
    """Application Auto Scaling's name for an endpoint's variant."""
    return f"endpoint/{endpoint_name}/variant/{variant}"


def register_scalable_target(autoscaling, endpoint_name: str, min_instances: int,
                             max_instances: int, variant: str = DEFAULT_VARIANT) -> None:
    """``register_scalable_target``: the variant's instance count may move in [min, max]."""
    if not 1 <= min_instances <= max_instances:
        raise DeployError(f"need 1 <= --min ({min_instances}) <= --max ({max_instances})")
    autoscaling.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=variant_resource_id(endpoint_name, variant),
        ScalableDimension="sagemaker:variant:DesiredInstanceCount",
        MinCapacity=min_instances,
        MaxCapacity=max_instances,
    )


def put_scaling_policy(autoscaling, endpoint_name: str, invocations_per_instance: float, *,
                       scale_in_cooldown: int = 300, scale_out_cooldown: int = 60,
                       variant: str = DEFAULT_VARIANT) -> str:
    """A target-tracking policy on ``SageMakerVariantInvocationsPerInstance``; its ARN.

    The metric counts invocations per instance per minute, summed over every model of the
    endpoint. Scaling out is quick and scaling in slow, because a new instance starts
    with no model loaded and pays a cold load for each one it is sent.
    """
    answer = autoscaling.put_scaling_policy(
        PolicyName=f"{endpoint_name}-invocations-per-instance",
        ServiceNamespace="sagemaker",
        ResourceId=variant_resource_id(endpoint_name, variant),
        ScalableDimension="sagemaker:variant:DesiredInstanceCount",
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(invocations_per_instance),
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance",
            },
            "ScaleInCooldown": scale_in_cooldown,
            "ScaleOutCooldown": scale_out_cooldown,
        },
    )
    return answer["PolicyARN"]


# -- command line --------------------------------------------------------------------


def boto3_client(service: str, region: str | None):
    """A boto3 client; ``sagemaker-runtime``'s waits past SageMaker's 60 s answer."""
    import boto3
    from botocore.config import Config

    config = Config(read_timeout=RUNTIME_READ_TIMEOUT_SECONDS) if service == "sagemaker-runtime" \
        else None
    return boto3.client(service, region_name=region, config=config)


def positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sagemaker_mme.py",
        description="Package, upload, deploy, invoke and autoscale mmserver on a SageMaker "
                    "multi-model endpoint.")
    parser.add_argument("--region", help="AWS region (default: boto3's configuration)")
    steps = parser.add_subparsers(dest="step", required=True)

    def step(name: str, summary: str) -> argparse.ArgumentParser:
        return steps.add_parser(name, help=summary, description=summary)

    package = step("package", "model folders -> OUT/NAME.tar.gz, the folder's files at the root")
    package.add_argument("models", nargs="+", metavar="[NAME=]DIR",
                         help="a model folder as mmserver loads it (model.pt, model.pt2, "
                              "code/, mmserver.json); NAME defaults to the folder's name")
    package.add_argument("--out", type=Path, required=True, help="folder for the archives")

    upload = step("upload", "archives -> s3://BUCKET/PREFIX/NAME.tar.gz, one object each")
    upload.add_argument("archives", nargs="+", type=Path, metavar="NAME.tar.gz",
                        help="archives written by package")
    upload.add_argument("--model-data", required=True, metavar="s3://BUCKET/PREFIX/",
                        help="the endpoint's prefix; every object under it is a model")
    upload.add_argument("--overwrite", action="store_true",
                        help="replace existing objects (instances may keep the old version)")

    deploy = step("deploy", "create the model (MultiModel), endpoint configuration and "
                            "endpoint, then wait for InService")
    deploy.add_argument("--endpoint", required=True, help="endpoint name")
    deploy.add_argument("--image", required=True,
                        help="ECR image URI, ACCOUNT.dkr.ecr.REGION.amazonaws.com/mmserver:TAG")
    deploy.add_argument("--role", required=True,
                        help="execution role ARN SageMaker assumes to pull the image and "
                             "read the prefix")
    deploy.add_argument("--model-data", required=True, metavar="s3://BUCKET/PREFIX/",
                        help="the prefix upload wrote to (the ModelDataUrl)")
    deploy.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE,
                        help="a CPU instance type (%(default)s)")
    deploy.add_argument("--instance-count", type=positive, default=1,
                        help="instances at start (%(default)s)")
    deploy.add_argument("--variant", default=DEFAULT_VARIANT,
                        help="production variant name (%(default)s)")
    deploy.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a container variable (MMSERVER_MAX_BATCH_SIZE=32); repeatable")
    deploy.add_argument("--model-name", help="SageMaker model name (default: the endpoint's)")
    deploy.add_argument("--endpoint-config-name",
                        help="endpoint configuration name (default: the endpoint's)")
    deploy.add_argument("--no-wait", action="store_true", help="return before InService")

    run = step("invoke", "one request to one model of the endpoint; prints the answer")
    run.add_argument("--endpoint", required=True, help="endpoint name")
    run.add_argument("--target-model", required=True, metavar="NAME.tar.gz",
                     help="the archive's key relative to the prefix")
    body = run.add_mutually_exclusive_group(required=True)
    body.add_argument("--data", help="the body, as text")
    body.add_argument("--body", type=Path, help="a file holding the body")
    run.add_argument("--content-type", default="application/json",
                     help="the body's type (%(default)s)")
    run.add_argument("--accept", default="application/json",
                     help="the answer's type (%(default)s)")
    run.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_SECONDS,
                     help="seconds to retry ModelNotReadyException (%(default)s)")

    scale = step("autoscale", "the instance count follows invocations per instance")
    scale.add_argument("--endpoint", required=True, help="endpoint name")
    scale.add_argument("--variant", default=DEFAULT_VARIANT,
                       help="production variant name (%(default)s)")
    scale.add_argument("--min", type=int, default=1, dest="min_instances", metavar="N",
                       help="fewest instances (%(default)s)")
    scale.add_argument("--max", type=int, required=True, dest="max_instances", metavar="N",
                       help="most instances")
    scale.add_argument("--target", type=float, required=True, metavar="INVOCATIONS",
                       help="invocations per instance per minute to hold (all models together)")
    scale.add_argument("--scale-in-cooldown", type=int, default=300, metavar="SECONDS",
                       help="wait after a scale-in before the next one (%(default)s)")
    scale.add_argument("--scale-out-cooldown", type=int, default=60, metavar="SECONDS",
                       help="wait after a scale-out before the next one (%(default)s)")
    return parser


def run_step(args: argparse.Namespace, client: Callable[[str], Any]) -> None:
    if args.step == "package":
        for spec in args.models:
            name, folder = parse_model_folder(spec)
            print(package_model(folder, args.out, name))
    elif args.step == "upload":
        bucket, prefix = parse_s3_prefix(args.model_data)
        for key in upload_archives(client("s3"), args.archives, bucket, prefix,
                                   overwrite=args.overwrite):
            print(f"s3://{bucket}/{key}")
    elif args.step == "deploy":
        environment = parse_env(args.env)
        model_data = model_data_url(*parse_s3_prefix(args.model_data))
        model_name = args.model_name or args.endpoint
        config_name = args.endpoint_config_name or args.endpoint
        sagemaker = client("sagemaker")
        print(create_model(sagemaker, model_name, args.image, model_data, args.role,
                           environment))
        print(create_endpoint_config(sagemaker, config_name, model_name, args.instance_type,
                                     args.instance_count, args.variant))
        print(create_endpoint(sagemaker, args.endpoint, config_name))
        if not args.no_wait:
            wait_in_service(sagemaker, args.endpoint)
            print(f"{args.endpoint} is InService")
    elif args.step == "invoke":
        body = args.body.read_bytes() if args.body is not None else args.data.encode()
        _, answer = invoke(client("sagemaker-runtime"), args.endpoint, args.target_model, body,
                           content_type=args.content_type, accept=args.accept,
                           ready_timeout=args.ready_timeout)
        sys.stdout.buffer.write(answer)
        sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
    elif args.step == "autoscale":
        autoscaling = client("application-autoscaling")
        register_scalable_target(autoscaling, args.endpoint, args.min_instances,
                                 args.max_instances, args.variant)
        print(put_scaling_policy(autoscaling, args.endpoint, args.target,
                                 scale_in_cooldown=args.scale_in_cooldown,
                                 scale_out_cooldown=args.scale_out_cooldown,
                                 variant=args.variant))


def main(argv: Sequence[str] | None = None,
         client: Callable[[str, str | None], Any] = boto3_client) -> int:
    """The command line; ``client(service, region)`` makes the boto3 clients (tests stub them)."""
    args = build_parser().parse_args(argv)
    try:
        run_step(args, lambda service: client(service, args.region))
    except DeployError as error:
        print(f"sagemaker_mme.py {args.step}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
