"""deploy/sagemaker_mme.py, offline: the archives it writes, and every AWS request it makes.

The archive is checked member by member and then loaded by a real mmserver process the
way SageMaker does it (unpacked into its own folder under the model root, ``POST /models``
with that folder as url). The AWS requests are checked with botocore's ``Stubber``:
``expected_params`` must equal what the script sends, and every client points at a closed
port on 127.0.0.1, so a request that escaped the stubs could not reach AWS either.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber
from conftest import ROOT, write_torchscript

from mmserver.harness.testing import ServerProcess

SPEC = importlib.util.spec_from_file_location("sagemaker_mme",
                                              ROOT / "deploy" / "sagemaker_mme.py")
mme = importlib.util.module_from_spec(SPEC)
sys.modules["sagemaker_mme"] = mme
SPEC.loader.exec_module(mme)

INFERENCE_PY = """\
import os

import torch

MMSERVER_ROW_WISE = True


def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt"))


def predict_fn(data, model):
    return model(data)
"""
SETTINGS = {"max_batch_size": 4, "max_wait_ms": 1}

IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/mmserver:0.1.0"
ROLE = "arn:aws:iam::123456789012:role/mmserver-sagemaker"
ENDPOINT = "mmserver-mme"
REGION = "eu-west-1"
ARN = f"arn:aws:sagemaker:{REGION}:123456789012"


def write_model(folder: Path) -> Path:
    """A folder as mmserver loads it: TorchScript weights, a script, batching settings."""
    write_torchscript(folder)
    (folder / "code").mkdir()
    (folder / "code" / "inference.py").write_text(INFERENCE_PY)
    (folder / "mmserver.json").write_text(json.dumps(SETTINGS))
    return folder


def members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return tar.getmembers()


def member_bytes(archive: Path, name: str) -> bytes:
    with tarfile.open(archive, "r:gz") as tar:
        return tar.extractfile(name).read()


# -- package ---------------------------------------------------------------------------


def test_the_archive_holds_the_folder_at_its_root(tmp_path):
    folder = write_model(tmp_path / "affine")
    archive = mme.package_model(folder, tmp_path / "dist")

    assert archive == tmp_path / "dist" / "affine.tar.gz"
    assert sorted(os.listdir(tmp_path / "dist")) == ["affine.tar.gz"]
    listed = members(archive)
    assert [m.name for m in listed] == ["code", "code/inference.py", "mmserver.json",
                                        "model.pt"]
    assert [m.type for m in listed] == [tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.REGTYPE,
                                        tarfile.REGTYPE]
    assert [m.mode for m in listed] == [0o755, 0o644, 0o644, 0o644]
    assert {(m.uid, m.gid, m.uname, m.gname) for m in listed} == {(0, 0, "", "")}
    for name in ("code/inference.py", "mmserver.json", "model.pt"):
        assert member_bytes(archive, name) == (folder / name).read_bytes()


def test_a_name_is_given_with_name_equals_folder(tmp_path, capsys):
    write_model(tmp_path / "tabular" / "model")

    assert mme.main(["package", "--out", str(tmp_path / "dist"),
                     f"tabular={tmp_path / 'tabular' / 'model'}"]) == 0

    assert capsys.readouterr().out == f"{tmp_path / 'dist' / 'tabular.tar.gz'}\n"
    assert [m.name for m in members(tmp_path / "dist" / "tabular.tar.gz")] == [
        "code", "code/inference.py", "mmserver.json", "model.pt"]


def test_the_same_files_give_the_same_bytes(tmp_path):
    folder = write_model(tmp_path / "affine")
    first = mme.package_model(folder, tmp_path / "one").read_bytes()
    second = mme.package_model(folder, tmp_path / "two").read_bytes()
    assert first == second


def test_pycache_is_left_out_and_an_inside_symlink_becomes_a_file(tmp_path):
    folder = write_model(tmp_path / "affine")
    (folder / "code" / "__pycache__").mkdir()
    (folder / "code" / "__pycache__" / "inference.cpython-311.pyc").write_bytes(b"\0")
    (folder / "weights").mkdir()
    (folder / "weights" / "w.bin").write_bytes(b"weights")
    (folder / "w.bin").symlink_to(folder / "weights" / "w.bin")
    (folder / "relative.bin").symlink_to("weights/w.bin")

    archive = mme.package_model(folder, tmp_path / "dist")

    listed = {m.name: m for m in members(archive)}
    assert sorted(listed) == ["code", "code/inference.py", "mmserver.json", "model.pt",
                              "relative.bin", "w.bin", "weights", "weights/w.bin"]
    for name in ("w.bin", "relative.bin"):
        assert listed[name].type == tarfile.REGTYPE
        assert member_bytes(archive, name) == b"weights"


@pytest.mark.parametrize("absolute", [True, False], ids=["absolute", "relative"])
def test_a_symlink_out_of_the_folder_is_refused(tmp_path, absolute):
    folder = write_model(tmp_path / "affine")
    (tmp_path / "secret.pt").write_bytes(b"not the model's")
    (folder / "extra.pt").symlink_to(tmp_path / "secret.pt" if absolute else "../secret.pt")

    with pytest.raises(mme.DeployError) as refused:
        mme.package_model(folder, tmp_path / "dist")

    assert str(refused.value) == (
        f"extra.pt in {folder} is a symlink to {tmp_path / 'secret.pt'}, outside the model "
        "folder; copy the file in instead")
    assert not (tmp_path / "dist").exists()


def test_a_symlink_out_of_the_folder_in_code_is_refused(tmp_path):
    folder = write_model(tmp_path / "affine")
    (tmp_path / "helpers.py").write_text("x = 1\n")
    (folder / "code" / "helpers.py").symlink_to(tmp_path / "helpers.py")

    with pytest.raises(mme.DeployError, match=r"^code/helpers\.py in .* outside the model"):
        mme.package_model(folder, tmp_path / "dist")


def test_a_symlinked_folder_a_dangling_link_and_a_fifo_are_refused(tmp_path):
    folder = write_model(tmp_path / "affine")
    (folder / "more").mkdir()
    (folder / "linked").symlink_to(folder / "more")
    with pytest.raises(mme.DeployError) as refused:
        mme.package_model(folder, tmp_path / "dist")
    assert str(refused.value) == (f"linked in {folder} is a symlinked folder; copy the "
                                  "folder in instead")

    (folder / "linked").unlink()
    (folder / "gone.pt").symlink_to(folder / "missing.pt")
    with pytest.raises(mme.DeployError) as refused:
        mme.package_model(folder, tmp_path / "dist")
    assert str(refused.value) == (f"gone.pt in {folder} is a symlink to "
                                  f"{folder / 'missing.pt'}, which does not exist")

    (folder / "gone.pt").unlink()
    os.mkfifo(folder / "pipe")
    with pytest.raises(mme.DeployError) as refused:
        mme.package_model(folder, tmp_path / "dist")
    assert str(refused.value) == f"pipe in {folder} is not a regular file"
    assert not (tmp_path / "dist").exists()


def test_the_folder_above_the_model_is_refused_with_a_hint(tmp_path):
    write_model(tmp_path / "tabular" / "model")
    with pytest.raises(mme.DeployError) as refused:
        mme.package_model(tmp_path / "tabular", tmp_path / "dist")
    assert str(refused.value) == (
        f"{tmp_path / 'tabular'} holds no model.pt, model.pt2, *.pt/*.pth or code/ at its "
        f"top; did you mean {tmp_path / 'tabular' / 'model'}?")


def test_names_and_output_folders_that_would_go_wrong_are_refused(tmp_path):
    folder = write_model(tmp_path / "affine")
    for name in ("", "a/b", "-x", "x.tar.gz", "x y"):
        with pytest.raises(mme.DeployError, match="^model name "):
            mme.package_model(folder, tmp_path / "dist", name)
    with pytest.raises(mme.DeployError) as refused:
        mme.package_model(folder, folder / "dist")
    assert str(refused.value) == (f"the archive {folder / 'dist' / 'affine.tar.gz'} would be "
                                  f"written inside {folder}")
    assert not (folder / "dist").exists()


def test_the_unpacked_archive_loads_in_mmserver_and_answers(tmp_path):
    archive = mme.package_model(write_model(tmp_path / "src" / "affine"), tmp_path / "dist")
    root = tmp_path / "models"
    model_name = "5a1d6c0e8f3b"  # SageMaker's model_name is opaque, not the TargetModel
    unpacked = root / model_name / "model"
    unpacked.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(unpacked, filter="data")

    with ServerProcess(["--model-root", str(root), "--no-access-log"], cwd=ROOT) as server:
        status, answer = server.json("POST", "/models",
                                     {"model_name": model_name, "url": str(unpacked)},
                                     headers={"X-Amzn-SageMaker-Target-Model": "affine.tar.gz"})
        assert (status, answer) == (200, {"status": f'Model "{model_name}" registered',
                                          "modelName": model_name,
                                          "modelUrl": str(unpacked)})
        status, answer = server.invoke(
            model_name, [[1.0, 2.0, 3.0], [0.0, 0.5, -1.0]],
            headers={"X-Amzn-SageMaker-Target-Model": "affine.tar.gz"})
        assert (status, answer) == (200, [[3.0, 5.0, 7.0], [1.0, 2.0, -1.0]])
        status, described = server.json("GET", f"/models/{model_name}")
        assert status == 200
        assert (described["batching"]["maxBatchSize"],
                described["batching"]["maxWaitMs"]) == (4, 1)


# -- AWS requests, stubbed -------------------------------------------------------------


def stubbed(service: str) -> tuple[object, Stubber]:
    client = boto3.client(service, region_name=REGION, endpoint_url="http://127.0.0.1:9",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    return client, Stubber(client)


class SameBytes:
    """Equal to an upload body that reads as this file's bytes (it is rewound after)."""

    def __init__(self, path: Path):
        self.expected = path.read_bytes()

    def __eq__(self, body) -> bool:
        data = body.read()
        body.seek(0)
        return data == self.expected

    def __repr__(self) -> str:
        return f"<{len(self.expected)} bytes>"


def test_upload_puts_one_object_a_model_under_the_prefix(tmp_path):
    archives = [mme.package_model(write_model(tmp_path / name), tmp_path / "dist")
                for name in ("affine", "tabular")]
    s3, stub = stubbed("s3")
    for archive in archives:
        key = f"models/v1/{archive.name}"
        stub.add_client_error("head_object", service_error_code="404", http_status_code=404,
                              expected_params={"Bucket": "bucket", "Key": key})
        stub.add_response("put_object", {},
                          {"Bucket": "bucket", "Key": key, "Body": SameBytes(archive),
                           "ChecksumAlgorithm": "SHA256"})
    bucket, prefix = mme.parse_s3_prefix("s3://bucket/models/v1/")

    with stub:
        keys = mme.upload_archives(s3, archives, bucket, prefix)
        stub.assert_no_pending_responses()

    assert keys == ["models/v1/affine.tar.gz", "models/v1/tabular.tar.gz"]
    assert mme.model_data_url(bucket, prefix) == "s3://bucket/models/v1/"


def test_upload_refuses_to_replace_an_object(tmp_path):
    archive = mme.package_model(write_model(tmp_path / "affine"), tmp_path / "dist")
    s3, stub = stubbed("s3")
    stub.add_response("head_object", {"ContentLength": 10},
                      {"Bucket": "bucket", "Key": "models/affine.tar.gz"})
    with stub, pytest.raises(mme.DeployError) as refused:
        mme.upload_archives(s3, [archive], "bucket", "models")
    assert str(refused.value) == ("s3://bucket/models/affine.tar.gz exists; upload the new "
                                  "version under a new name (or pass --overwrite)")
    stub.assert_no_pending_responses()

    stub.add_response("put_object", {}, {"Bucket": "bucket", "Key": "models/affine.tar.gz",
                                         "Body": ANY, "ChecksumAlgorithm": "SHA256"})
    with stub:
        assert mme.upload_archives(s3, [archive], "bucket", "models",
                                   overwrite=True) == ["models/affine.tar.gz"]
    stub.assert_no_pending_responses()


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/", "s3://bucket//",
                                 "bucket/models/", "https://bucket/models/"])
def test_a_prefix_must_be_s3_bucket_and_a_non_empty_prefix(url):
    with pytest.raises(mme.DeployError) as refused:
        mme.parse_s3_prefix(url)
    assert str(refused.value) == f"{url!r} is not s3://BUCKET/PREFIX/ with a non-empty PREFIX"


def described_endpoint(status: str, **more: str) -> dict:
    """A ``describe_endpoint`` answer, as the waiter reads it."""
    return {"EndpointName": ENDPOINT, "EndpointArn": f"{ARN}:endpoint/{ENDPOINT}",
            "EndpointStatus": status, "CreationTime": 0, "LastModifiedTime": 0, **more}


def test_deploy_creates_a_multi_model_endpoint_and_waits(capsys):
    sagemaker, stub = stubbed("sagemaker")
    stub.add_response("create_model", {"ModelArn": f"{ARN}:model/{ENDPOINT}"}, {
        "ModelName": ENDPOINT,
        "ExecutionRoleArn": ROLE,
        "PrimaryContainer": {
            "Image": IMAGE,
            "Mode": "MultiModel",
            "ModelDataUrl": "s3://bucket/models/",
            "Environment": {"MMSERVER_MAX_BATCH_SIZE": "32", "MMSERVER_MAX_WAIT_MS": "2",
                            "MMSERVER_MEMORY_BUDGET_MB": "12000"},
        },
    })
    stub.add_response("create_endpoint_config",
                      {"EndpointConfigArn": f"{ARN}:endpoint-config/{ENDPOINT}"}, {
        "EndpointConfigName": ENDPOINT,
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": ENDPOINT,
                                "InstanceType": "ml.c5.2xlarge", "InitialInstanceCount": 2}],
    })
    stub.add_response("create_endpoint", {"EndpointArn": f"{ARN}:endpoint/{ENDPOINT}"},
                      {"EndpointName": ENDPOINT, "EndpointConfigName": ENDPOINT})
    stub.add_response("describe_endpoint", described_endpoint("InService"),
                      {"EndpointName": ENDPOINT})
    regions = []

    def client(service, region):
        regions.append((service, region))
        return sagemaker

    with stub:
        assert mme.main(["--region", REGION, "deploy", "--endpoint", ENDPOINT,
                         "--image", IMAGE, "--role", ROLE, "--model-data", "s3://bucket/models",
                         "--instance-type", "ml.c5.2xlarge", "--instance-count", "2",
                         "--env", "MMSERVER_MAX_BATCH_SIZE=32",
                         "--env", "MMSERVER_MAX_WAIT_MS=2",
                         "--env", "MMSERVER_MEMORY_BUDGET_MB=12000"], client) == 0
    stub.assert_no_pending_responses()
    assert regions == [("sagemaker", REGION)]
    assert capsys.readouterr().out == (f"{ARN}:model/{ENDPOINT}\n"
                                       f"{ARN}:endpoint-config/{ENDPOINT}\n"
                                       f"{ARN}:endpoint/{ENDPOINT}\n"
                                       f"{ENDPOINT} is InService\n")


def test_deploy_says_why_an_endpoint_failed(capsys):
    sagemaker, stub = stubbed("sagemaker")
    stub.add_response("describe_endpoint", described_endpoint(
        "Failed", FailureReason="The primary container did not pass the ping health check."),
        {"EndpointName": ENDPOINT})
    with stub, pytest.raises(mme.DeployError) as failed:
        mme.wait_in_service(sagemaker, ENDPOINT)
    assert str(failed.value) == (f"endpoint {ENDPOINT} is not InService (Failed): The primary "
                                 "container did not pass the ping health check.")


def test_env_pairs_become_the_environment_and_breaking_ones_are_refused():
    assert mme.parse_env(["MMSERVER_MAX_MODELS=20", "SAGEMAKER_MODEL_SERVER_TIMEOUT=30",
                          "EXTRA_FLAGS=a=b"]) == {
        "MMSERVER_MAX_MODELS": "20", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "30",
        "EXTRA_FLAGS": "a=b"}
    for pair, message in [
        ("MMSERVER_HOST=127.0.0.1", "--env MMSERVER_HOST: the image binds 0.0.0.0; anything "
                                    "else is unreachable from SageMaker"),
        ("MMSERVER_MANAGEMENT_TOKEN=x", "--env MMSERVER_MANAGEMENT_TOKEN: SageMaker's POST "
                                        "/models sends no token, so every load would answer 401"),
        ("SAGEMAKER_MULTI_MODEL=false", "--env SAGEMAKER_MULTI_MODEL: a multi-model endpoint "
                                        "needs the multi-model routes"),
        ("NOEQUALS", "--env 'NOEQUALS' is not KEY=VALUE"),
        ("1X=2", "--env '1X=2' is not KEY=VALUE"),
    ]:
        with pytest.raises(mme.DeployError) as refused:
            mme.parse_env([pair])
        assert str(refused.value) == message
    with pytest.raises(mme.DeployError, match="^--env A is given twice$"):
        mme.parse_env(["A=1", "A=2"])


def test_a_refused_env_stops_deploy_before_any_request(capsys):
    def client(service, region):
        raise AssertionError(f"no client may be made, {service} was")

    assert mme.main(["deploy", "--endpoint", ENDPOINT, "--image", IMAGE, "--role", ROLE,
                     "--model-data", "s3://bucket/models/", "--env", "MMSERVER_HOST=0"],
                    client) == 2
    assert capsys.readouterr().err == ("sagemaker_mme.py deploy: --env MMSERVER_HOST: the "
                                       "image binds 0.0.0.0; anything else is unreachable "
                                       "from SageMaker\n")


def invoke_answer(body: bytes) -> dict:
    return {"Body": StreamingBody(io.BytesIO(body), len(body)),
            "ContentType": "application/json"}


def test_invoke_names_the_target_model(capsys):
    runtime, stub = stubbed("sagemaker-runtime")
    stub.add_response("invoke_endpoint", invoke_answer(b"[[3.0, 5.0, 7.0]]"), {
        "EndpointName": ENDPOINT, "TargetModel": "affine.tar.gz",
        "ContentType": "application/json", "Accept": "application/json",
        "Body": b"[[1, 2, 3]]"})
    with stub:
        assert mme.main(["invoke", "--endpoint", ENDPOINT, "--target-model", "affine.tar.gz",
                         "--data", "[[1, 2, 3]]"], lambda service, region: runtime) == 0
    stub.assert_no_pending_responses()
    assert capsys.readouterr().out == "[[3.0, 5.0, 7.0]]\n"


def test_invoke_retries_while_the_model_is_not_ready():
    runtime, stub = stubbed("sagemaker-runtime")
    params = {"EndpointName": ENDPOINT, "TargetModel": "tabular.tar.gz",
              "ContentType": "text/csv", "Accept": "text/csv", "Body": b"1,2\n"}
    for _ in range(3):
        stub.add_client_error("invoke_endpoint", service_error_code="ModelNotReadyException",
                              http_status_code=429, expected_params=params)
    stub.add_response("invoke_endpoint", invoke_answer(b"3,4\n"), params)
    pauses = []
    with stub:
        answer = mme.invoke(runtime, ENDPOINT, "tabular.tar.gz", b"1,2\n",
                            content_type="text/csv", accept="text/csv",
                            sleep=pauses.append, clock=lambda: sum(pauses))
    stub.assert_no_pending_responses()
    assert answer == ("application/json", b"3,4\n")
    assert pauses == [1.0, 2.0, 4.0]


def test_invoke_gives_up_on_a_model_not_ready_after_the_timeout():
    runtime, stub = stubbed("sagemaker-runtime")
    for _ in range(4):
        stub.add_client_error("invoke_endpoint", service_error_code="ModelNotReadyException",
                              http_status_code=429)
    pauses = []
    with stub, pytest.raises(runtime.exceptions.ModelNotReadyException):
        mme.invoke(runtime, ENDPOINT, "big.tar.gz", b"[]", ready_timeout=10,
                   sleep=pauses.append, clock=lambda: sum(pauses))
    assert pauses == [1.0, 2.0, 4.0]
    stub.assert_no_pending_responses()


def test_autoscale_registers_the_variant_and_tracks_invocations_per_instance(capsys):
    autoscaling, stub = stubbed("application-autoscaling")
    target = {"ServiceNamespace": "sagemaker",
              "ResourceId": f"endpoint/{ENDPOINT}/variant/AllTraffic",
              "ScalableDimension": "sagemaker:variant:DesiredInstanceCount"}
    stub.add_response("register_scalable_target", {},
                      {**target, "MinCapacity": 2, "MaxCapacity": 8})
    policy_arn = ("arn:aws:autoscaling:eu-west-1:123456789012:scalingPolicy:"
                  "0b3e1c2a-1111-2222-3333-444455556666:resource/sagemaker/"
                  f"endpoint/{ENDPOINT}/variant/AllTraffic:policyName/"
                  f"{ENDPOINT}-invocations-per-instance")
    stub.add_response("put_scaling_policy", {"PolicyARN": policy_arn}, {
        **target,
        "PolicyName": f"{ENDPOINT}-invocations-per-instance",
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 600.0,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            "ScaleInCooldown": 600,
            "ScaleOutCooldown": 60,
        },
    })
    with stub:
        assert mme.main(["autoscale", "--endpoint", ENDPOINT, "--min", "2", "--max", "8",
                         "--target", "600", "--scale-in-cooldown", "600"],
                        lambda service, region: autoscaling) == 0
    stub.assert_no_pending_responses()
    assert capsys.readouterr().out == f"{policy_arn}\n"


def test_autoscale_refuses_a_range_it_cannot_hold():
    for low, high in [(0, 2), (3, 2)]:
        with pytest.raises(mme.DeployError) as refused:
            mme.register_scalable_target(object(), ENDPOINT, low, high)
        assert str(refused.value) == f"need 1 <= --min ({low}) <= --max ({high})"
