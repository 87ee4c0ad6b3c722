"""A metered PDU over SNMP: the only module that imports ``pysnmp`` (7.x, its asyncio
API; the ``[snmp]`` extra). One GET a poll for the objects ``core.pdumib`` names, the
figure they give handed to a :class:`~powerbudgetd.channels.meter.MeterChannel` under
the source name ``pdu``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    get_cmd,
)
from pysnmp.hlapi.v3arch import asyncio as hlapi

from powerbudgetd.channels.meter import MeterChannel, MeterError
from powerbudgetd.channels.ups import BudgetSink
from powerbudgetd.config.meters import PduConfig
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.pdumib import Figure, PduError, figure, oids

SOURCE = "pdu"
MAX_VARBINDS = 24  # per GET: keeps a request and its answer within one UDP datagram

# pysnmp's error indications (pysnmp.proto.errind) that mean a v3 user or key was refused
_AUTH_ERRORS = frozenset({"WrongDigest", "UnknownUserName", "DecryptionError", "UnknownSecurityName",
                          "UnsupportedSecurityLevel", "AuthenticationFailure", "AuthenticationError"})
_DIGESTS = {"MD5": "usmHMACMD5AuthProtocol", "SHA": "usmHMACSHAAuthProtocol",
            "SHA224": "usmHMAC128SHA224AuthProtocol", "SHA256": "usmHMAC192SHA256AuthProtocol",
            "SHA384": "usmHMAC256SHA384AuthProtocol", "SHA512": "usmHMAC384SHA512AuthProtocol"}
_CIPHERS = {"DES": "usmDESPrivProtocol", "AES": "usmAesCfb128Protocol", "AES192": "usmAesCfb192Protocol",
            "AES256": "usmAesCfb256Protocol"}


def _auth(cfg: PduConfig) -> Any:
    if cfg.version == "2c":
        assert cfg.community is not None  # the config requires it
        return CommunityData(cfg.community.get_secret_value(), mpModel=1)
    auth = cfg.auth_key.get_secret_value() if cfg.auth_key is not None else None
    priv = cfg.priv_key.get_secret_value() if cfg.priv_key is not None else None
    return UsmUserData(
        cfg.username, authKey=auth, privKey=priv,
        authProtocol=getattr(hlapi, _DIGESTS[cfg.digest]) if auth else hlapi.usmNoAuthProtocol,
        privProtocol=getattr(hlapi, _CIPHERS[cfg.cipher]) if priv else hlapi.usmNoPrivProtocol,
    )


# The SMI types the PDU MIBs give their figures in (INTEGER, Integer32, Unsigned32,
# Gauge32). Anything else at those OIDs is not the object asked for: a DisplayString of
# digits, a counter, TimeTicks would all turn into a number and be read as watts.
INTEGER_TYPES = frozenset({"Integer", "Integer32", "Unsigned32", "Gauge32"})


def snmp_integer(oid: str, value: Any) -> int:
    """The integer an agent gave at ``oid``. Raises MeterError ``garbled`` for a value
    of another SMI type (an OctetString, a Counter32/64, TimeTicks...), naming it."""
    kind = value.__class__.__name__
    if kind not in INTEGER_TYPES:
        shown = value.prettyPrint()[:40] if hasattr(value, "prettyPrint") else repr(value)[:40]
        raise MeterError("garbled", f"{oid}: a {kind} ({shown!r}), not an integer: the agent does not serve "
                                    "that object as the PDU's MIB defines it (check vendor, pdu, inlet and outlets)")
    return int(value)


class SnmpPdu:
    """The PDU's SNMP agent: :meth:`read` is one poll's :class:`Figure`; raises
    MeterError ``timeout`` (no answer), ``auth_failed`` (a v3 user or key refused),
    ``absent`` (an object the agent does not serve), ``garbled`` or ``error``."""

    def __init__(self, cfg: PduConfig) -> None:
        self.cfg = cfg
        self.engine = SnmpEngine()
        self.auth = _auth(cfg)
        self.oids = oids(cfg.vendor, cfg.pdu, cfg.inlet, cfg.outlets)
        self._target: Any = None

    async def read(self) -> Figure:
        cfg = self.cfg
        if self._target is None:
            try:
                self._target = await UdpTransportTarget.create((cfg.host, cfg.port), timeout=cfg.timeout_s, retries=0)
            except Exception as exc:  # noqa: BLE001 - a name that does not resolve, a bad address
                raise MeterError("unreachable", f"{cfg.host}:{cfg.port}: {exc}") from None
        values: dict[str, int | None] = {}
        for i in range(0, len(self.oids), MAX_VARBINDS):
            chunk = self.oids[i:i + MAX_VARBINDS]
            error, status, index, binds = await get_cmd(
                self.engine, self.auth, self._target, ContextData(), *(ObjectType(ObjectIdentity(o)) for o in chunk))
            if error:
                text = str(error)
                kind = type(error).__name__
                cause = ("timeout" if kind == "RequestTimedOut" or "timeout" in text.lower()
                         else "auth_failed" if kind in _AUTH_ERRORS else "error")
                raise MeterError(cause, f"{cfg.host}:{cfg.port}: {text}")
            if status:
                raise MeterError("error", f"{cfg.host}:{cfg.port}: {status.prettyPrint()} at "
                                          f"{chunk[int(index) - 1] if index else '?'}")
            for oid, bind in zip(chunk, binds, strict=True):
                value = bind[1]
                if value.__class__.__name__ in ("NoSuchInstance", "NoSuchObject", "EndOfMibView"):
                    values[oid] = None
                    continue
                values[oid] = snmp_integer(oid, value)
        try:
            return figure(cfg.vendor, cfg.pdu, cfg.inlet, cfg.outlets, values)
        except PduError as exc:
            raise MeterError(exc.cause, str(exc)) from None

    def close(self) -> None:
        self.engine.close_dispatcher()


def pdu_channel(cfg: PduConfig, sink: BudgetSink, feed: Feed, *, registry: CollectorRegistry = REGISTRY,
                clock: Callable[[], float] = time.monotonic) -> MeterChannel:
    """The ``pdu`` source: :class:`SnmpPdu` read through a :class:`MeterChannel`."""
    agent = SnmpPdu(cfg)
    return MeterChannel(SOURCE, cfg, cfg.where(), agent.read, sink, feed, registry=registry, clock=clock)


__all__ = ["INTEGER_TYPES", "SOURCE", "SnmpPdu", "pdu_channel", "snmp_integer"]
