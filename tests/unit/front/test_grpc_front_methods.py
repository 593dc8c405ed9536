"""The gRPC front's table of Triton's methods, written out so that the supervisor need not import tritonclient, held
to the service descriptor of the tritonclient installed here."""

from __future__ import annotations

from ftx_triton.front.grpc_front import service_methods


def test_the_relayed_methods_are_tritons_service_as_tritonclient_describes_it() -> None:
    from tritonclient.grpc import service_pb2

    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    described = {f"/{service.full_name}/{m.name}": m.client_streaming or m.server_streaming for m in service.methods}
    assert all(m.client_streaming == m.server_streaming for m in service.methods)  # the relay streams both ways or not
    assert service_methods() == {**described, "/grpc.health.v1.Health/Check": False}
