"""Chat messages for one text-to-SQL question.

    system:     the task and the answer format (<think>...</think> then a ```sql block; with
                prefill, the ```sql block only, since the assistant turn already opens it)
    user/asst:  `num_shots` worked examples (question over its own relevant tables -> gold SQL)
    user:       schema (CREATE TABLE + sample values), evidence, question

The worked examples always show only their relevant tables, so that shots cost little even when
the question itself gets the whole schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recipes.text2sql.schema import schema_prompt, tables_in_sql

PREFILL = "```sql\nSELECT"

SYSTEM_THINK = (
    "You are an expert SQLite developer. Given a database schema, optional evidence (external "
    "knowledge) and a question, write one SQLite query that answers the question. Select only the "
    "columns the question asks for.\n"
    "Answer format: reason briefly inside <think>...</think>, then give the final query in a "
    "```sql code block."
)
SYSTEM_PREFILL = (
    "You are an expert SQLite developer. Given a database schema, optional evidence (external "
    "knowledge) and a question, write one SQLite query that answers the question. Select only the "
    "columns the question asks for.\n"
    "Answer with the query alone in a ```sql code block."
)

# Multi-turn (recipe option multiturn, env.name: text2sql, env.py): the model sees each query's result
MULTITURN_NOTE = (
    "\nEach query you write is run on the database and you are shown its first rows. Then write the same "
    "query again to submit it as your answer, or a corrected query."
)


@dataclass(frozen=True)
class Shot:
    """A worked example: its question, evidence and gold SQL, and its database."""

    question: str
    evidence: str
    sql: str
    db_path: Path


def user_turn(schema: str, question: str, evidence: str) -> str:
    parts = [f"Database schema:\n{schema}"]
    if evidence:
        parts.append(f"Evidence: {evidence}")
    parts.append(f"Question: {question}")
    return "\n\n".join(parts)


def assistant_answer(sql: str, db_path: Path, prefill: bool) -> str:
    """A shot's answer in the format the model should copy."""
    if prefill:
        return f"```sql\n{sql}\n```"
    tables = ", ".join(tables_in_sql(sql, db_path))
    return f"<think>\nThe question needs the table(s) {tables}.\n</think>\n```sql\n{sql}\n```"


def build_messages(
    question: str,
    evidence: str,
    db_path: Path,
    tables: list[str] | None,
    shots: list[Shot],
    prefill: bool,
    num_values: int,
    multiturn: bool = False,
) -> list[dict[str, str]]:
    system = (SYSTEM_PREFILL if prefill else SYSTEM_THINK) + (MULTITURN_NOTE if multiturn else "")
    messages = [{"role": "system", "content": system}]
    for shot in shots:
        shot_schema = schema_prompt(shot.db_path, tables_in_sql(shot.sql, shot.db_path), num_values)
        messages.append({"role": "user", "content": user_turn(shot_schema, shot.question, shot.evidence)})
        messages.append({"role": "assistant", "content": assistant_answer(shot.sql, shot.db_path, prefill)})
    schema = schema_prompt(db_path, tables, num_values)
    messages.append({"role": "user", "content": user_turn(schema, question, evidence)})
    return messages
