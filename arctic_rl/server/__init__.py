"""The backend process: the controller (owns the engines, dispatches ops), its Ray deployment and the
HTTP front end. Clients reach it through Ray or HTTP, never by importing it."""
