"""The web tools' pure parts: address rules, numeric host forms, page text, charsets."""

from __future__ import annotations

import ipaddress
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.web.addresses import (
    Reach,
    Refused,
    address_refusal,
    check_target,
    host_matches,
    numeric_ipv4,
)
from toold_daemon.web.nesting import MAX_NESTING, nests_deeper_than
from toold_daemon.web.pages import SelectorError, decode, html_text, kind_of, sniff
from toold_daemon.web.search import hits, plain


def _forms(value: int) -> list[str]:
    """Every way the C library spells a 32-bit address."""
    a, b, c, d = value.to_bytes(4, "big")
    return [
        str(value),
        hex(value),
        "0" + oct(value)[2:],
        f"{a}.{b}.{c}.{d}",
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        f"{hex(a)}.{hex(b)}.{hex(c)}.{hex(d)}",
        f"0{oct(a)[2:]}.{b}.{c}.{d}.",
    ]


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_numeric_hosts_mean_what_the_c_library_says_they_mean(value: int) -> None:
    for form in _forms(value):
        ours = numeric_ipv4(form)
        assert ours == ipaddress.IPv4Address(value), form
        assert socket.inet_aton(form.rstrip(".")) == ours.packed, form


@pytest.mark.parametrize("name", ["example.com", "1.2.3.4.5", "0x", "1e3", "127.0.0.256", "08.1", "", "a.1"])
def test_names_are_not_numbers(name: str) -> None:
    if name == "0x":
        assert numeric_ipv4(name) == ipaddress.IPv4Address(0)  # as inet_aton reads it
        return
    assert numeric_ipv4(name) is None


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.1.1", "172.31.0.1", "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.251",
     "240.0.0.1", "255.255.255.255", "::1", "::", "fd12::1", "fe80::1", "ff02::1", "::ffff:10.0.0.1",
     "64:ff9b::a00:1", "2002:c0a8:101::1", "::7f00:1", "192.0.2.1", "198.18.0.1"],
)  # fmt: skip
def test_internal_addresses_are_refused(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), ()) != ""


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "64:ff9b::808:808"])
def test_public_addresses_are_reached(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), ()) == ""


def test_allowed_networks_exempt_an_address_in_every_spelling() -> None:
    allowed = [ipaddress.ip_network("127.0.0.1/32")]
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), allowed) == ""
    assert address_refusal(ipaddress.ip_address("::ffff:127.0.0.1"), allowed) == ""
    assert address_refusal(ipaddress.ip_address("127.0.0.2"), allowed) != ""


def test_the_url_text_check() -> None:
    reach = Reach.of([8080], [], ["*.bad.example"], [])
    assert check_target("http", "0x7f.1", 8080, Reach.of([8080], ["127.0.0.0/8"])) == "127.0.0.1"
    assert check_target("https", "Example.COM.", None, reach) == "example.com"
    for scheme, host, port, why in (
        ("ftp", "example.com", None, "only http and https"),
        ("http", "example.com", 22, "port 22"),
        ("http", "x.bad.example", None, "denied_hosts"),
        ("http", "2130706433", 8080, "loopback"),
        ("http", "", None, "no host"),
    ):
        with pytest.raises(Refused, match=why):
            check_target(scheme, host, port, reach)


def test_host_globs() -> None:
    assert host_matches("a.example.com", ["*.example.com"]) and not host_matches("example.com", ["*.example.com"])
    assert host_matches("example.com", ["example.com"]) and not host_matches("evil-example.com", ["*.example.com"])


def test_a_page_nested_beyond_reason_is_plain_text_in_a_moment() -> None:
    html = "<div>" * 50_000 + "<style>p {}</style>deep &lt;text&gt;" + "</div>" * 50_000
    started = time.thread_time()
    text, matched = html_text(html, "http://x/")
    assert time.thread_time() - started < 1.0  # the HTML parser took 7-12 s of CPU on this page
    assert text == f"[elements nested more than {MAX_NESTING} deep: the page's plain text]\n\ndeep <text>"
    assert matched == 1
    with pytest.raises(SelectorError, match="too deep to select from"):
        html_text(html, "http://x/", "div")


def test_deep_but_reasonable_pages_and_long_flat_ones_are_rendered() -> None:
    deep = "<div>" * 400 + "<h2>Head</h2><ul><li>one<li>two</ul>" + "</div>" * 400
    assert html_text(deep, "http://x/")[0] == "## Head\n\n- one\n- two"
    flat = "<table>" + "<tr><td>a<td>b" * 5_000 + "</table>" + "<p>para" * 5_000 + "<br><img alt=x>" * 5_000
    assert not nests_deeper_than(flat)
    closed = "<span>x</span>" * 10_000 + "<!-- <div><div> -->" * 5_000 + "<script>'<div>'</script>" * 5_000
    assert not nests_deeper_than(closed)


@pytest.mark.parametrize(
    "hidden",
    [
        "</span>",  # an end tag nothing opened is ignored by the parser
        "<!--</div>-->",  # so is one in a comment
        "<script></div></script >",  # or in a script
        "<style></div></styles></div></style>",  # which ends at its own end tag only
    ],
)
def test_end_tags_the_parser_ignores_do_not_make_a_page_look_shallow(hidden: str) -> None:
    page = ("<div>" + hidden) * (MAX_NESTING + 1)
    assert nests_deeper_than(page)


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.just("text"),
        lambda inner: st.tuples(st.sampled_from(["div", "span", "b", "p", "li"]), st.lists(inner, max_size=3)),
        max_leaves=40,
    )
)
def test_the_nesting_estimate_is_never_shallower_than_the_tree(tree: object) -> None:
    def render(node: object) -> tuple[str, int]:
        if node == "text":
            return "t", 0
        name, children = node  # type: ignore[misc]
        parts = [render(child) for child in children]
        inner = "".join(html for html, _ in parts)
        below = max((depth for _, depth in parts), default=0)
        counted = 0 if name in ("p", "li") else 1
        return f"<{name}>{inner}</{name}>", below + counted

    page, depth = render(tree)
    if depth:
        assert nests_deeper_than(page + "<br>" * depth, depth - 1)  # enough tags to be looked at
    assert not nests_deeper_than(page + "<br>" * depth, depth)


def test_kinds_and_charsets() -> None:
    assert kind_of("text/html; charset=utf-8", b"") == "html"
    assert kind_of("application/vnd.api+json", b"") == "json"
    assert kind_of("application/pdf", b"%PDF") == "binary"
    assert kind_of("application/octet-stream", b"plain words") == "text"
    assert kind_of("", b"<!DOCTYPE html><p>") == "html"
    assert sniff(b"\x00\x01\x02") == "binary"
    assert decode("é".encode("utf-16"), "text/plain", "text") == "é"  # a byte order mark
    assert decode(b"caf\xc3\xa9", "text/plain; charset=bogus-charset", "text") == "café"  # unknown label: detect
    assert decode("naïve".encode() + b"\xe2\x82", "text/plain", "text").startswith("naïve")  # cut mid-character


def test_search_text_is_plain_and_bounded() -> None:
    assert plain("<b>Fish</b> &amp;\n chips", "title") == "Fish & chips"
    assert len(plain("x" * 5000, "snippet")) == 1000
    found = hits([("t", "https://a", "s"), ("no url", None, "s"), ("t2", "https://b", None)], 5)
    assert [h.url for h in found] == ["https://a", "https://b"]
