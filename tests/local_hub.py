"""A small local stand-in for the Hugging Face Hub's HTTP API, for offline end-to-end tests. It is NOT the Hub.

It keeps model repos in memory and speaks only the routes that the real huggingface_hub client (2.4) calls to
- create a repo (`POST /api/repos/create`) and a branch (`POST /api/models/{repo}/branch/{branch}`),
- upload a folder: validate the card's YAML (`POST /api/validate-yaml`), ask how to upload each file
  (`POST .../preupload/{rev}`; every file is answered `uploadMode: "regular"`, so contents travel base64-encoded
  inside the commit and no LFS or Xet storage is involved), then commit (`POST .../commit/{rev}`, ndjson);
- open a pull request (`POST .../discussions`, `GET .../discussions/{num}`), as `upload_folder(create_pr=True)` does;
- download: `HEAD`/`GET /{repo}/resolve/{rev}/{path}` with the headers hf_hub_download reads (X-Repo-Commit, ETag,
  Content-Length; X-Error-Code on 404), `GET /api/models/{repo}[/revision/{rev}]` and `.../tree/{rev}[/{path}]`.

Routes it does not know answer 404 with a message naming them, so a client change shows up as a clear failure.
Every request is recorded in `LocalHub.requests`; commits in `LocalHub.commits`.
"""

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

CREATED_AT = "2026-01-01T00:00:00.000Z"
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"  # what the Hub puts in a new repo


def blob_oid(content):
    """The git blob id of `content`, which the Hub returns as a regular file's oid and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    private: bool
    commits: dict = field(default_factory=dict)  # commit sha -> {path: bytes}, a full snapshot
    refs: dict = field(default_factory=dict)  # "main", "dev", "refs/pr/1" -> commit sha
    pulls: list = field(default_factory=list)  # {"num", "title", "description"}

    def commit(self, ref, files, message):
        sha = hashlib.sha1(json.dumps([ref, message, self.refs.get(ref), len(self.commits),
                                       sorted((p, blob_oid(c)) for p, c in files.items())]).encode()).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        return sha

    def resolve(self, revision):
        return self.refs.get(revision) or (revision if revision in self.commits else None)


class HubError(Exception):
    def __init__(self, status, message, code=None, headers=None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


class LocalHub:
    """`with LocalHub() as hub:` serves on `hub.url` (127.0.0.1, a free port) until the block ends."""

    def __init__(self):
        self.repos = {}
        self.requests = []  # {"method", "path", "query", "json", "authorization"}
        self.commits = []  # {"repo_id", "revision", "create_pr", "summary", "paths", "sha"}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def file(self, repo_id, path, revision="main"):
        repo = self.repos[repo_id]
        return repo.commits[repo.resolve(revision)][path]

    def calls(self, method, path_part):
        return [r for r in self.requests if r["method"] == method and path_part in r["path"]]

    # ---- routes; each returns (status, json body or bytes, headers)

    def _repo(self, repo_id, authorization):
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorization):
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def _revision(self, repo, revision):
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return sha

    def create_repo(self, body):
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else f"local-user/{body['name']}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}, {}
        repo = self.repos[repo_id] = Repo(private=body.get("visibility") == "private")
        repo.commit("main", {".gitattributes": GITATTRIBUTES}, "initial commit")
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id}, {}

    def create_branch(self, repo, branch, body):
        if branch in repo.refs:
            raise HubError(409, f"Reference already exists: refs/heads/{branch}")
        repo.refs[branch] = self._revision(repo, body.get("startingPoint") or "main")
        return 200, {}, {}

    def preupload(self, repo, revision, body):
        files = repo.commits[self._revision(repo, revision)]
        return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                "oid": blob_oid(files[f["path"]]) if f["path"] in files else None}
                               for f in body["files"]],
                     "commitOid": repo.resolve(revision)}, {}

    def create_pull(self, repo, repo_id, title, description):
        num = len(repo.pulls) + 1
        repo.pulls.append({"num": num, "title": title, "description": description})
        repo.refs[f"refs/pr/{num}"] = repo.refs["main"]
        return num, f"{self.url}/{repo_id}/discussions/{num}"

    def commit(self, repo, repo_id, revision, create_pr, raw):
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        pr_url = None
        if create_pr:
            self._revision(repo, revision)
            num, pr_url = self.create_pull(repo, repo_id, header["summary"], header.get("description", ""))
            revision = f"refs/pr/{num}"
        files = dict(repo.commits[self._revision(repo, revision)])
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"unsupported encoding {value.get('encoding')!r} for {value['path']}")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                files = {p: c for p, c in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            elif key != "header":
                raise HubError(400, f"this local hub only takes regular (base64) uploads, not {key!r}")
        sha = repo.commit(revision, files, header["summary"])
        self.commits.append({"repo_id": repo_id, "revision": revision, "create_pr": create_pr,
                             "summary": header["summary"], "sha": sha,
                             "paths": sorted(line["value"]["path"] for line in lines if line["key"] == "file")})
        return 200, {"success": True, "commitOid": sha, "commitUrl": f"{self.url}/{repo_id}/commit/{sha}",
                     "hookOutput": "", "pullRequestUrl": pr_url}, {}

    def pull_details(self, repo, repo_id, num):
        if not 1 <= num <= len(repo.pulls):
            raise HubError(404, f"Discussion {num} not found")
        pull = repo.pulls[num - 1]
        return 200, {"num": num, "title": pull["title"], "author": {"name": "local-user"}, "createdAt": CREATED_AT,
                     "status": "draft", "repo": {"name": repo_id, "type": "model"}, "isPullRequest": True,
                     "events": [], "filesWithConflicts": [], "changes": {"base": "refs/heads/main"}, "diff": ""}, {}

    def model_info(self, repo, repo_id, revision):
        sha = self._revision(repo, revision)
        return 200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private, "disabled": False,
                     "gated": False, "tags": [], "downloads": 0, "likes": 0, "createdAt": CREATED_AT,
                     "lastModified": CREATED_AT, "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])]}, {}

    def tree(self, repo, revision, path, recursive):
        files = repo.commits[self._revision(repo, revision)]
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        entries, folders = [], set()
        for name in sorted(files):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            entries.append({"type": "file", "oid": blob_oid(files[name]), "size": len(files[name]), "path": name})
        if prefix and not entries and not folders:
            raise HubError(404, f"{path} does not exist on this revision", "EntryNotFound")
        folders = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
        return 200, folders + entries, {}

    def resolve_file(self, repo, revision, path):
        sha = self._revision(repo, revision)
        files = repo.commits[sha]
        if path not in files:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": sha})
        content = files[path]
        return 200, content, {"X-Repo-Commit": sha, "ETag": f'"{blob_oid(content)}"',
                              "Content-Type": "application/octet-stream"}

    def route(self, method, raw_path, query, body, authorization):
        parts = [unquote(p) for p in raw_path.strip("/").split("/")]  # split before unquoting: revisions hold %2F
        write = method == "POST" and parts[:2] != ["api", "validate-yaml"]
        if write and not authorization:
            raise HubError(401, "Invalid credentials in Authorization header", "Unauthorized",
                           {"X-Error-Message": "Invalid credentials in Authorization header"})
        if method == "POST" and parts == ["api", "repos", "create"]:
            return self.create_repo(json.loads(body))
        if method == "POST" and parts == ["api", "validate-yaml"]:
            return 200, {"errors": [], "warnings": []}, {}
        if method == "GET" and parts == ["api", "agent-harnesses"]:  # the client's best-effort agent detection
            return 200, {"standardEnvVars": [], "harnesses": {}}, {}
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id, rest = f"{parts[2]}/{parts[3]}", parts[4:]
            repo = self._repo(repo_id, authorization)
            if method == "POST" and rest[:1] == ["preupload"] and len(rest) == 2:
                return self.preupload(repo, rest[1], json.loads(body))
            if method == "POST" and rest[:1] == ["commit"] and len(rest) == 2:
                return self.commit(repo, repo_id, rest[1], query.get("create_pr") == "1", body)
            if method == "POST" and rest[:1] == ["branch"] and len(rest) == 2:
                return self.create_branch(repo, rest[1], json.loads(body or b"{}"))
            if method == "POST" and rest == ["discussions"]:
                request = json.loads(body)
                num, url = self.create_pull(repo, repo_id, request["title"], request.get("description", ""))
                return 200, {"num": num, "url": url, "pullRequest": True}, {}
            if method == "GET" and rest[:1] == ["discussions"] and len(rest) == 2:
                return self.pull_details(repo, repo_id, int(rest[1]))
            if method == "GET" and (not rest or (rest[:1] == ["revision"] and len(rest) == 2)):
                return self.model_info(repo, repo_id, rest[1] if rest else "main")
            if method == "GET" and rest[:1] == ["tree"] and len(rest) >= 2:
                return self.tree(repo, rest[1], "/".join(rest[2:]), query.get("recursive") in ("1", "true", "True"))
        if method in ("GET", "HEAD") and len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{parts[0]}/{parts[1]}"
            return self.resolve_file(self._repo(repo_id, authorization), parts[3], "/".join(parts[4:]))
        raise HubError(404, f"the local hub does not implement {method} {raw_path}")


def _handler(hub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while (size := int(self.rfile.readline().strip(), 16)) > 0:
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self, method):
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = self._body() if method == "POST" else b""
            authorization = self.headers.get("Authorization")
            try:
                parsed = json.loads(body) if body and "json" in self.headers.get("Content-Type", "") else None
            except ValueError:
                parsed = None
            with hub.lock:
                hub.requests.append({"method": method, "path": unquote(url.path), "query": query, "json": parsed,
                                     "authorization": authorization})
                try:
                    status, payload, headers = hub.route(method, url.path, query, body, authorization)
                except HubError as error:
                    status, payload = error.status, {"error": str(error)}
                    headers = {**error.headers, **({"X-Error-Code": error.code} if error.code else {})}
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            if not isinstance(payload, bytes):
                self.send_header("Content-Type", "application/json")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_HEAD(self):
            self._serve("HEAD")

        def do_POST(self):
            self._serve("POST")

    return Handler
