"""todo: the agent's own task list, kept in the ToolBox for the length of a rollout.

Items have a stable integer id, a text and a status (pending, in_progress, completed,
cancelled). Every call answers with the whole list, so the agent always sees its plan.
`TodoList.unfinished()` (pending + in_progress) feeds the reward's auxiliary terms: an agent
that ends with open items it wrote itself probably did not finish.

The list is bounded (`MAX_ITEMS` items of at most `MAX_ITEM_CHARS` characters), since every
call returns all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opencomposer.harness.tools.base import ToolError, ToolSpec, params

STATUSES = ("pending", "in_progress", "completed", "cancelled")
MAX_ITEMS, MAX_ITEM_CHARS = 100, 1_000


@dataclass
class TodoItem:
    id: int
    content: str
    status: str = "pending"


@dataclass
class TodoList:
    items: list[TodoItem] = field(default_factory=list)

    def unfinished(self) -> int:
        return sum(item.status in ("pending", "in_progress") for item in self.items)

    def get(self, item_id: int | None) -> TodoItem:
        if item_id is None:
            raise ToolError("invalid_arguments", "this action needs argument 'id'")
        for item in self.items:
            if item.id == item_id:
                return item
        ids = ", ".join(str(i.id) for i in self.items) or "none yet"
        raise ToolError("not_found", f"no todo item with id {item_id} (ids: {ids})")

    def render(self) -> str:
        if not self.items:
            return "The todo list is empty."
        width = max(len(s) for s in STATUSES) + 2
        rows = [f"{item.id:3d}. {'[' + item.status + ']':<{width}} {item.content}" for item in self.items]
        return f"Todo list ({self.unfinished()} of {len(self.items)} unfinished):\n" + "\n".join(rows)


async def todo(box, args: dict) -> str:
    todos: TodoList = box.todos
    action = args["action"]
    if action == "add":
        texts = [t.strip() for t in args.get("items", [])]
        if not texts or not all(texts):
            raise ToolError("invalid_arguments", "action 'add' needs 'items': a list of non-empty task texts")
        if len(todos.items) + len(texts) > MAX_ITEMS:
            raise ToolError("invalid_arguments", f"the list holds {len(todos.items)} items and would hold "
                            f"{len(todos.items) + len(texts)}; at most {MAX_ITEMS} are kept: finish, cancel or "
                            "merge items instead")
        next_id = max((i.id for i in todos.items), default=0) + 1
        todos.items += [TodoItem(next_id + k, text) for k, text in enumerate(texts)]
    elif action == "update":
        item = todos.get(args.get("id"))
        if "status" not in args and "content" not in args:
            raise ToolError("invalid_arguments", "action 'update' needs 'status' and/or 'content'")
        item.status = args.get("status", item.status)
        item.content = args.get("content", item.content).strip() or item.content
    elif action == "complete":
        todos.get(args.get("id")).status = "completed"
    return todos.render()


TODO_TOOL = ToolSpec(
    "todo",
    "Keep a task list for the current job: 'add' items, 'update' an item's status or text, "
    "'complete' an item, or 'list' them. Every call returns the whole list. Finish or cancel "
    "every item before you stop.",
    params(["action"],
           action={"type": "string", "enum": ["add", "update", "complete", "list"]},
           items={"type": "array", "items": {"type": "string", "maxLength": MAX_ITEM_CHARS},
                  "description": "Task texts to add (action 'add')."},
           id={"type": "integer", "description": "Item id (actions 'update' and 'complete')."},
           status={"type": "string", "enum": list(STATUSES), "description": "New status (action 'update')."},
           content={"type": "string", "maxLength": MAX_ITEM_CHARS, "description": "New text (action 'update')."}),
    todo)
