"""Class W: a host name is judged in the spelling the resolver looks it up in.

Python's resolver turns a name that is not ASCII into IDNA's ASCII form, and that
mapping changes names: it drops the soft hyphen and the zero-width joiners, folds the
long s, full-width letters and ``ß``, and takes the ideographic full stop for a dot. A
denied name written with any of them used to be judged as written (not denied) and then
looked up as the denied name; so was one with a NUL after it (the C library's lookup
stops there). Each spelling is tried against the rules of both the
commands' egress proxy and ``web_fetch``, and through a real proxy: a command sends the
raw request lines itself (curl would convert the name first)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.webserver import Server
from toold_client import APPROVE_ALL
from toold_daemon.config import Config
from toold_daemon.egress.rules import EgressRules
from toold_daemon.tools.web_fetch import WebFetch, WebFetchArgs
from toold_daemon.web.addresses import Reach, Refused, check_target, normal_host

#: ``denied.example`` respelled: each is looked up as that name.
RESPELLINGS = [
    "den\u00adied.example",  # soft hyphen: dropped
    "denied\u200d.example",  # zero-width joiner: dropped
    "deni\u00ade\u200bd.example",  # soft hyphen and zero-width space: both dropped
    "deni\u00ade\u200cd.example",
    "\uff44\uff45\uff4e\uff49\uff45\uff44.example",  # full-width letters
    "denied\u3002example",  # ideographic full stop
    "denied\uff0eexample",  # full-width full stop
    "DENIED.EXAMPLE",
    "denied.example.",
]


@pytest.mark.parametrize("spelled", RESPELLINGS)
def test_every_spelling_looked_up_as_a_denied_name_is_denied(spelled: str) -> None:
    assert normal_host(spelled) == "denied.example"
    rules = EgressRules.of(allowed_domains=["*"], denied_domains=["denied.example"])
    judgement, why, normal = rules.judge(spelled, 443)
    assert (judgement, normal) == ("deny", "denied.example"), why
    with pytest.raises(Refused, match="denied_hosts"):
        check_target("https", spelled, None, Reach.of(denied_hosts=["denied.example"]))


def test_letters_the_lookup_folds_reach_the_name_they_fold_to() -> None:
    assert normal_host("\u017fecret.example") == "secret.example"  # long s
    assert normal_host("stra\u00dfe.example") == "strasse.example"  # sharp s
    rules = EgressRules.of(denied_domains=["secret.example", "*.strasse.example"])
    assert rules.judge("\u017fecret.example", 443)[0] == "deny"
    assert rules.judge("a.stra\u00dfe.example", 443)[0] == "deny"


def test_configured_names_in_any_script_are_matched_in_the_form_looked_up() -> None:
    rules = EgressRules.of(denied_domains=["*.b\u00fccher.example", "B\u00fccher.Example."])
    spellings = ("b\u00fccher.example", "xn--bcher-kva.example", "www.B\u00dcCHER.example", "www.xn--bcher-kva.example")
    for host in spellings:
        assert rules.judge(host, 443)[0] == "deny", host
    assert rules.judge("bucher.example", 443)[0] == "ask"


def test_trusted_hosts_are_matched_in_the_form_looked_up_too() -> None:
    """web_fetch's GETs of a trusted host run unasked: the trust goes to the name that is
    reached, however the URL or the configuration spells it, and to no other."""
    config = Config()
    web = msgspec.structs.replace(config.tools.web, trusted_hosts=["B\u00fccher.Example."])
    config = msgspec.structs.replace(config, tools=msgspec.structs.replace(config.tools, web=web))
    tool = WebFetch()

    def asks(url: str) -> bool:
        return tool.prompts(WebFetchArgs(url=url), {}, config)

    assert not asks("http://B\u00dcCHER.example/page") and not asks("https://xn--bcher-kva.example/")
    assert asks("http://bucher.example/") and asks("http://www.b\u00fccher.example/")
    assert asks("http://xn--bcher-kva.example.evil.example/")


@pytest.mark.parametrize(
    "host",
    [
        "\ufffd.example",
        "a" * 64 + "\u00e9.example",
        "\u00ad.example",
        "a..\u00e9",
        "denied.example\x00",  # looked up as denied.example: the C library stops at the NUL
        "denied.example\x00.allowed.example",
        "denied\x7f.example",
        "denied.example\x1b[2J",
        "den\x85ied.example",  # a C1 control: not a name either
    ],
)
def test_a_name_no_resolver_takes_is_refused_not_judged_as_written(host: str) -> None:
    with pytest.raises(Refused):
        normal_host(host)
    assert EgressRules.of(allowed_domains=["*"]).judge(host, 443)[0] == "deny"


def test_ascii_names_and_addresses_are_as_before() -> None:
    assert normal_host("Example.COM.") == "example.com"
    assert normal_host("0x7f.1") == "127.0.0.1"
    assert normal_host("[::1]") == "::1"
    assert normal_host("\uff10x7f.1") == "127.0.0.1"  # a full-width digit: the address it is looked up as


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, site: Server) -> Iterator[DaemonProcess]:
    """``localhost`` is denied by name; every other name (and address) is allowed."""
    config = f"""
[tools.approval]
allowlist = ["shell", "run_code"]

[tools.network]
allowed_domains = ["*"]
denied_domains = ["localhost"]
allowed_networks = ["127.0.0.0/8"]
allowed_ports = [{site.port}]
"""
    with module_daemon(tmp_path_factory, "egress-names", config) as d:
        yield d


#: A command speaking to its proxy with the name's bytes as given (latin-1, as the proxy
#: reads a request line), in an HTTP CONNECT and in an absolute-form GET.
_RAW_REQUESTS = """
import os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
for line in ({connect!r}, {get!r}):
    with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as s:
        s.sendall(line.encode("latin-1") + b"\\r\\nHost: x\\r\\n\\r\\n")
        print(repr(line), s.recv(200).split(b"\\r\\n")[0].decode())
"""


@pytest.mark.parametrize("spelled", ["loc\u00adalhost", "LOC\u00adALHOST", "localhost", "localhost\x00.example"])
def test_a_command_cannot_reach_a_denied_name_through_a_respelling(
    daemon: DaemonProcess, site: Server, spelled: str
) -> None:
    code = _RAW_REQUESTS.format(
        connect=f"CONNECT {spelled}:{site.port} HTTP/1.1",
        get=f"GET http://{spelled}:{site.port}/json HTTP/1.1",
    )
    before = len(site.requests)
    with daemon.client(timeout=60) as c:
        result = c.call(
            "run_code", {"language": "python", "code": code, "network": True}, on_confirm=lambda r: APPROVE_ALL
        )
    assert result.ok, result.content
    assert result.content.count(" 403") == 2, result.content  # both refused, by the rules
    assert len(site.requests) == before  # nothing reached the server
    records = result.data["network"]
    assert len(records) == 2 and all(r["refused"] for r in records)
    if "\x00" in spelled:  # no host name at all: refused as such, and kept as it came
        assert all(r["host"] == spelled and "control character" in r["refused"] for r in records)
    else:
        assert all(r["host"] == "localhost" and "denied_domains" in r["refused"] for r in records)


def test_the_same_command_reaches_an_allowed_name(daemon: DaemonProcess, site: Server) -> None:
    """The control: the proxy and the server are reachable, so the refusals above are the rules'."""
    code = _RAW_REQUESTS.format(
        connect=f"CONNECT 127.0.0.1:{site.port} HTTP/1.1",
        get=f"GET http://127.0.0.1:{site.port}/json HTTP/1.1",
    )
    with daemon.client(timeout=60) as c:
        result = c.call(
            "run_code", {"language": "python", "code": code, "network": True}, on_confirm=lambda r: APPROVE_ALL
        )
    assert result.ok, result.content
    assert " 200" in result.content, result.content
