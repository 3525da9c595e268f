"""register_instance for CUDA devices: regions as cudaIpcMemHandle_t bytes.

No GPU is needed: the handles here name nothing, and each case is refused
either locally (wrong length), by the protocol decoder / fd check (wrong count,
wrong device, fds with handles) or by the Manager itself (no GPU tier, or no
such device).
"""

from __future__ import annotations

import pytest

import orbitkv

HANDLE = bytes(range(64))


def two_regions() -> orbitkv.InstanceLayout:
    return orbitkv.split_layout(8, [4096, 4096])


def test_wrong_length_ipc_handle_is_a_value_error(client):
    layout = two_regions()
    with pytest.raises(ValueError, match=r"ipc_handles\[1\] must be exactly 64 bytes.*got 63") as e:
        client.register_instance("ipc", 0, "cuda:0", layout, ipc_handles=[HANDLE, bytes(63)])
    assert not isinstance(e.value, orbitkv.OrbitKVError)  # refused before anything was sent
    assert "cudaIpcMemHandle_t" in str(e.value)
    with pytest.raises(ValueError, match=r"ipc_handles\[0\] must be exactly 64 bytes.*got 65"):
        client.register_instance("ipc", 0, "cuda:0", layout, [], [bytearray(65), HANDLE])
    with pytest.raises(TypeError, match="ipc_handles must be a list"):
        client.register_instance("ipc", 0, "cuda:0", layout, ipc_handles=HANDLE * 2)
    with pytest.raises(TypeError, match=r"ipc_handles\[0\]"):
        client.register_instance("ipc", 0, "cuda:0", layout, ipc_handles=["x" * 64, HANDLE])
    # memoryview and bytearray of the right length are accepted locally (the
    # Manager then decides: see below).
    with pytest.raises(orbitkv.OrbitKVError):
        client.register_instance(
            "ipc", 0, "cuda:0", layout, ipc_handles=[memoryview(HANDLE), bytearray(HANDLE)]
        )


def test_ipc_handles_must_match_device_and_regions(client):
    layout = two_regions()
    # One handle per region.
    with pytest.raises(orbitkv.InvalidArgumentError, match="RegisterInstance.ipc_handles"):
        client.register_instance("ipc", 0, "cuda:0", layout, ipc_handles=[HANDLE])
    with pytest.raises(orbitkv.InvalidArgumentError, match="RegisterInstance.ipc_handles"):
        client.register_instance("ipc", 0, "cuda:0", layout)
    # Only "host" or "cuda:N".
    for device in ["cuda:", "cuda:01x", "cuda:-1", "cuda:1024", "gpu:0"]:
        with pytest.raises(orbitkv.InvalidArgumentError, match="RegisterInstance.device"):
            client.register_instance("ipc", 0, device, layout, ipc_handles=[HANDLE, HANDLE])
    # Host regions travel as memfds, not handles.
    regions = orbitkv.allocate_regions(layout)
    with pytest.raises(orbitkv.InvalidArgumentError, match="RegisterInstance.ipc_handles"):
        client.register_instance("ipc", 0, "host", layout, regions, [HANDLE, HANDLE])
    # A CUDA register with fds as well as handles.
    with pytest.raises(orbitkv.InvalidArgumentError, match="file descriptors"):
        client.register_instance("ipc", 0, "cuda:0", layout, regions, [HANDLE, HANDLE])
    # The connection is still good, and host registration unchanged.
    inst = client.register_instance("ipc", 0, "host", layout, regions)
    client.unregister_instance(inst)
    inst = client.register_instance("ipc", 0, "host", layout, regions, ipc_handles=[])
    client.unregister_instance(inst)


def test_cuda_register_fails_with_the_managers_error(client):
    # A well-formed CUDA registration reaches the Manager, which cannot serve
    # it here (no GPU tier, or no CUDA device / no such allocation): whatever
    # its code, the message names the device.
    layout = two_regions()
    with pytest.raises(orbitkv.OrbitKVError) as e:
        client.register_instance("ipc", 0, "cuda:0", layout, ipc_handles=[HANDLE, HANDLE])
    assert "cuda" in str(e.value)
    # The session survives the refusal.
    regions = orbitkv.allocate_regions(layout)
    client.unregister_instance(client.register_instance("ipc", 0, "host", layout, regions))
