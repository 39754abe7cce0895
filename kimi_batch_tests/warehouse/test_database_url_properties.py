"""A `KIMI_BATCH_DATABASE_URL` means one server, database and login to every consumer: the state
databases (psycopg reads the URL itself), the Iceberg catalog (SQLAlchemy's URL) and Trino's
catalog (a JDBC URL and its user and password properties). Property: for any user, password,
host, port, database name and libpq parameters, spelled percent-encoded in the URL or in its
query, each consumer is handed exactly those."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from kimi_batch.paths import database_server
from kimi_batch.settings import Settings
from kimi_batch.warehouse import (
    LEDGER_SCHEMA,
    CatalogSpec,
    catalog_properties,
    catalog_property_map,
)
from kimi_batch_tests.support.java_properties import read_like_java

_BASE = Settings.from_env()
_JDBC = "iceberg.jdbc-catalog."

# Printable text without NUL (libpq refuses it), any of URL syntax's characters included.
_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00", exclude_categories=["Cs"]),
    min_size=1,
    max_size=12,
)
_hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,6}){0,2}", fullmatch=True),
    st.sampled_from(["127.0.0.1", "::1", "fe80::1"]),
)
_params = st.dictionaries(
    st.sampled_from(["sslmode", "application_name", "connect_timeout", "options"]),
    _text,
    max_size=3,
)


def _url(
    user: str, password: str, host: str, port: int | None, dbname: str, params: dict[str, str],
    login_in_query: bool,
) -> str:  # fmt: skip
    address = f"[{host}]" if ":" in host else host
    netloc = address + (f":{port}" if port is not None else "")
    query = dict(params)
    if login_in_query:
        query |= {"user": user, "password": password}
    else:
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{netloc}"
    encoded = urlencode(query, quote_via=quote)
    return f"postgresql://{netloc}/{quote(dbname, safe='')}" + (f"?{encoded}" if encoded else "")


@settings(max_examples=150, deadline=None)
@given(
    user=_text,
    password=_text,
    host=_hosts,
    port=st.none() | st.integers(1, 65535),
    dbname=_text,
    params=_params,
    login_in_query=st.booleans(),
)
def test_every_consumer_is_handed_the_same_server_database_and_login(
    user: str,
    password: str,
    host: str,
    port: int | None,
    dbname: str,
    params: dict[str, str],
    login_in_query: bool,
) -> None:
    url = _url(user, password, host, port, dbname, params, login_in_query)
    deployment = Settings.model_validate({**_BASE.model_dump(), "database_url": url})

    # The state databases: psycopg reads the URL as it is.
    assert conninfo_to_dict(url) == {
        "user": user,
        "password": password,
        "host": host,
        **({"port": str(port)} if port is not None else {}),
        "dbname": dbname,
        **params,
    }

    # The Iceberg catalog: SQLAlchemy's URL, on the ledger's schema after the URL's options.
    iceberg = make_url(CatalogSpec.from_settings(deployment).database.get_secret_value())
    assert (iceberg.username, iceberg.password, iceberg.host, iceberg.port) == (
        user,
        password,
        host,
        port,
    )
    assert iceberg.database == dbname
    options = " ".join(o for o in (params.get("options"), f"-csearch_path={LEDGER_SCHEMA}") if o)
    assert dict(iceberg.query) == {**params, "options": options}

    # Trino's catalog: the JDBC driver percent-decodes the database name and the parameters
    # (java.net.URLDecoder: '+' is a space).
    properties = read_like_java(catalog_properties(deployment).encode())
    assert properties == catalog_property_map(deployment)
    jdbc = urlsplit(properties[_JDBC + "connection-url"].removeprefix("jdbc:"))
    assert jdbc.scheme == "postgresql"
    assert (jdbc.hostname, jdbc.port) == (host, port or 5432)
    assert unquote(jdbc.path.removeprefix("/")) == dbname
    assert dict(parse_qsl(jdbc.query)) == {**params, "currentSchema": LEDGER_SCHEMA}
    assert properties[_JDBC + "connection-user"] == user
    assert properties[_JDBC + "connection-password"] == password


# Found by the property above, each failing before its fix.


def test_a_host_and_port_in_the_query_are_the_server_trino_and_iceberg_use() -> None:
    # libpq (so the state databases) connects to `other:5434`; Trino once went to `db:5432`.
    url = "postgresql://kimi@db/kimi?host=other&port=5434"
    deployment = Settings.model_validate({**_BASE.model_dump(), "database_url": url})
    jdbc = catalog_property_map(deployment)[_JDBC + "connection-url"]
    assert jdbc.startswith("jdbc:postgresql://other:5434/kimi?")
    iceberg = make_url(CatalogSpec.from_settings(deployment).database.get_secret_value())
    assert (iceberg.host, iceberg.port) == ("other", 5434)


def test_the_url_s_own_options_stay_beside_the_ledger_schema() -> None:
    url = "postgresql://kimi@db/kimi?options=-c%20statement_timeout%3D5000"
    deployment = Settings.model_validate({**_BASE.model_dump(), "database_url": url})
    iceberg = make_url(CatalogSpec.from_settings(deployment).database.get_secret_value())
    # Two `options` parameters were sent before: psycopg kept one of them.
    assert iceberg.query["options"] == f"-c statement_timeout=5000 -csearch_path={LEDGER_SCHEMA}"


def test_a_password_and_a_home_folder_past_ascii_reach_trino_as_written(tmp_path: Path) -> None:
    home = tmp_path / "jürgen's 数据"
    url = "postgresql://kimi:p%C3%A4ss%F0%9F%94%91@db/kimi"
    deployment = Settings.model_validate({**_BASE.model_dump(), "home": home, "database_url": url})
    properties = read_like_java(catalog_properties(deployment).encode())
    # UTF-8 bytes read as ISO-8859-1 once made `pÃ¤ss...`: a login Trino could never make.
    assert properties[_JDBC + "connection-password"] == "päss🔑"
    folder = Settings.model_validate({**_BASE.model_dump(), "home": home})
    sqlite = read_like_java(catalog_properties(folder).encode())[_JDBC + "connection-url"]
    assert sqlite == f"jdbc:sqlite:{home}/ledger/ledger.sqlite3"


def test_a_hostaddr_is_the_address_trino_connects_to() -> None:
    # libpq connects to `hostaddr` (`host` names the server for TLS); Trino went to `db`.
    url = "postgresql://kimi@db/kimi?hostaddr=10.0.0.9&sslmode=require"
    deployment = Settings.model_validate({**_BASE.model_dump(), "database_url": url})
    jdbc = catalog_property_map(deployment)[_JDBC + "connection-url"]
    assert (
        jdbc
        == f"jdbc:postgresql://10.0.0.9:5432/kimi?sslmode=require&currentSchema={LEDGER_SCHEMA}"
    )


def test_under_verify_full_trino_connects_by_the_name_the_certificate_holds() -> None:
    url = "postgresql://kimi@db.internal/kimi?hostaddr=10.0.0.9&sslmode=verify-full"
    deployment = Settings.model_validate({**_BASE.model_dump(), "database_url": url})
    jdbc = catalog_property_map(deployment)[_JDBC + "connection-url"]
    assert jdbc.startswith("jdbc:postgresql://db.internal:5432/kimi?sslmode=verify-full&")


def test_a_service_name_and_a_hostaddr_list_are_refused_when_the_settings_are_read() -> None:
    for url in (
        "postgresql:///kimi?service=team",
        "postgresql://db/kimi?hostaddr=10.0.0.9,10.0.0.10",
    ):
        with pytest.raises(ValidationError, match="database_url"):
            Settings.model_validate({**_BASE.model_dump(), "database_url": url})


def test_a_database_server_s_repr_shows_no_ssl_password() -> None:
    server = database_server("postgresql://kimi:pw@db/kimi?sslpassword=key-secret")
    assert "key-secret" not in repr(server)
    assert "pw" not in repr(server).replace("password", "")
