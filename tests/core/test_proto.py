"""The committed protobuf module matches proto/torchrecord.proto, and keeps caffe2's numbers.

The wire format does not depend on the protobuf runtime: CI's oldest leg
(scripts/test-oldest.sh) runs this file and the round-trip and fast-path tests on
protobuf 3.20.3 too."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from torchrecord._proto import torchrecord_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "torchrecord.proto"


def _compiled(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpc_tools is not importable (pip install grpcio-tools, in the dev extra)")
    out = tmp_path / "set.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO.parent}",
            f"--descriptor_set_out={out}",
            PROTO.name,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert [f.name for f in fds.file] == ["torchrecord.proto"]
    return fds.file[0]


def _committed() -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)


def _normalized(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """Drop what only a descriptor set carries: protoc fills in every field's json_name there,
    while the descriptor embedded in generated Python code leaves it out."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    out.ClearField("source_code_info")

    def strip(messages: Any) -> None:
        for message in messages:
            for field in message.field:
                field.ClearField("json_name")
            strip(message.nested_type)

    strip(out.message_type)
    return out


def test_generated_module_matches_the_proto(tmp_path: Path) -> None:
    compiled, committed = _compiled(tmp_path), _committed()
    assert committed.name == "torchrecord.proto"
    assert committed.package == compiled.package == "torchrecord"
    assert _normalized(committed) == _normalized(compiled), (
        "torchrecord/_proto/torchrecord_pb2.py is out of date with proto/torchrecord.proto: "
        "run python scripts/gen_proto.py"
    )


def test_module_is_what_gen_proto_writes(tmp_path: Path) -> None:
    """The committed module is the generator's output, unedited, and has no runtime version
    check (protoc's own Python output refuses protobuf runtimes older than protoc)."""
    spec = importlib.util.spec_from_file_location("_gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    gen_proto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_proto)
    committed = (ROOT / "torchrecord" / "_proto" / "torchrecord_pb2.py").read_text()
    assert committed == gen_proto.render_module(_normalized(_compiled(tmp_path))), (
        "torchrecord/_proto/torchrecord_pb2.py differs from the generator's output: run python scripts/gen_proto.py"
    )
    assert "runtime_version" not in committed


def test_comparison_sees_a_change(tmp_path: Path) -> None:
    """Control: renumbering one field makes the descriptors differ."""
    compiled = _compiled(tmp_path)
    changed = descriptor_pb2.FileDescriptorProto()
    changed.CopyFrom(compiled)
    changed.message_type[0].field[0].number = 99
    assert _normalized(changed) != _normalized(_committed())
    assert _normalized(compiled) == _normalized(_committed())


def _fields(message: str) -> dict[str, int]:
    desc = pb.DESCRIPTOR.message_types_by_name[message]
    return {f.name: f.number for f in desc.fields}


def test_caffe2_field_numbers() -> None:
    assert _fields("TensorProto") == {
        "dims": 1,
        "data_type": 2,
        "string_data": 6,
        "name": 7,
        "storage_type": 12,
        "raw_data": 13,
    }
    assert _fields("TensorProtos") == {"protos": 1}
    protos = pb.DESCRIPTOR.message_types_by_name["TensorProtos"].fields_by_name["protos"]
    assert protos.message_type.full_name == "torchrecord.TensorProto"
    dims = pb.DESCRIPTOR.message_types_by_name["TensorProto"].fields_by_name["dims"]
    assert dims.type == dims.TYPE_INT64
    # is_repeated is new in protobuf 5.x; older runtimes only have label (deprecated since).
    assert dims.is_repeated if hasattr(dims, "is_repeated") else dims.label == dims.LABEL_REPEATED


def test_caffe2_data_type_values() -> None:
    values = {v.name: v.number for v in pb.TensorProto.DataType.DESCRIPTOR.values}
    caffe2 = {
        "FLOAT": 1,
        "INT32": 2,
        "BYTE": 3,
        "STRING": 4,
        "BOOL": 5,
        "UINT8": 6,
        "INT8": 7,
        "UINT16": 8,
        "INT16": 9,
        "INT64": 10,
        "FLOAT16": 12,
        "DOUBLE": 13,
    }
    for name, number in caffe2.items():
        assert values[name] == number, name
    extensions = {n: v for n, v in values.items() if n not in caffe2 and n != "UNDEFINED"}
    assert all(v >= 100 for v in extensions.values()), f"extensions must not collide with caffe2: {extensions}"
    storage = {v.name: v.number for v in pb.TensorProto.StorageType.DESCRIPTOR.values}
    assert storage["TYPED"] == 1 and storage["RAW"] == 2


def test_a_record_parses_as_plain_tensor_protos(tmp_path: Path) -> None:
    """A stored record is a TensorProtos a caffe2-style reader can parse field by field."""
    import numpy as np

    import torchrecord

    rf = torchrecord.write_record(
        [(np.arange(6, dtype=np.int32).reshape(2, 3), "hi")], tmp_path / "p.tr", progress=False
    )
    msg = pb.TensorProtos.FromString(rf.raw(0))
    array, text = msg.protos
    assert list(array.dims) == [2, 3]
    assert array.data_type == pb.TensorProto.INT32
    assert array.storage_type == pb.TensorProto.RAW
    assert np.frombuffer(array.raw_data, dtype="<i4").tolist() == list(range(6))
    assert text.data_type == pb.TensorProto.STRING
    assert list(text.string_data) == [b"hi"]
