#!/usr/bin/env node
// Reference oracle: runs pi's own (v0.73.x) session + compaction code so the Python port's tests can
// compare their results with pi's.
//
//   node oracle.mjs prepare FILE [--keep-recent N] [--reserve N] [--leaf ID | --leaf-line N]
//   node oracle.mjs context FILE [--leaf ID | --leaf-line N]
//
// Prints exactly one JSON object on stdout. Errors print {ok:false, error} and exit with code 1.
//
// Rules:
// * FILE is never opened by pi directly. It is copied into a fresh temp dir first, because pi's
//   SessionManager migrates old (v1/v2) files and REWRITES them in place when it opens them. The temp
//   dir is removed afterwards.
// * Entries are identified by their 0-based INDEX in the active path (root->leaf, header excluded)
//   and by their `id`. pi's v1->v2 migration assigns RANDOM 8-hex ids (crypto.randomUUID), so ids of
//   migrated files differ from run to run; indices and line numbers do not.
// * Line numbers (1-based, in the ORIGINAL file) are found by re-parsing the original text with
//   exactly pi's loader rules (content.trim().split("\n"), skip blank lines, skip lines that are not
//   valid JSON; see loadEntriesFromFile in dist/core/session-manager.js). The k-th parsed object is the
//   k-th element of SessionManager's file entries (pi keeps file order, and migration only mutates
//   objects in place), so pi's entry objects are mapped to lines by position, and each pairing is
//   checked by comparing `type` and `timestamp` (which migration never changes).
// * --leaf-line N selects as leaf the entry that came from line N of the original file (useful for
//   v1 files whose ids are random).
//
// pi modules are imported from the installed package's dist/ by file URL: the package's "exports"
// map only exposes "." (which lacks prepareCompaction / estimateContextTokens) and "./hooks", and
// importing "." also loads the whole TUI (about 1 s instead of about 0.3 s).

import { copyFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const PKG_DIST = join(HERE, "node_modules", "@mariozechner", "pi-coding-agent", "dist");

function fail(message) {
	process.stdout.write(`${JSON.stringify({ ok: false, error: String(message) })}\n`);
	process.exit(1);
}

async function loadPi() {
	const url = (rel) => pathToFileURL(join(PKG_DIST, rel)).href;
	let sm, comp, utils, pkg;
	try {
		pkg = JSON.parse(readFileSync(join(PKG_DIST, "..", "package.json"), "utf8"));
		sm = await import(url("core/session-manager.js"));
		comp = await import(url("core/compaction/compaction.js"));
		utils = await import(url("core/compaction/utils.js"));
	} catch (e) {
		throw new Error(
			`cannot load @mariozechner/pi-coding-agent from ${PKG_DIST} (run scripts/ensure-pi-oracle.sh): ${e?.message ?? e}`,
		);
	}
	return { sm, comp, utils, version: pkg.version };
}

function parseArgs(argv) {
	const [command, file, ...rest] = argv;
	if (!command || !["prepare", "context"].includes(command)) {
		throw new Error("usage: oracle.mjs prepare|context FILE [--keep-recent N] [--reserve N] [--leaf ID | --leaf-line N]");
	}
	if (!file) throw new Error(`${command}: missing FILE`);
	const opts = { command, file, keepRecent: undefined, reserve: undefined, leaf: undefined, leafLine: undefined };
	const intArg = (name, v) => {
		if (v === undefined || !/^-?\d+$/.test(v)) throw new Error(`${name} needs an integer, got ${v}`);
		return Number.parseInt(v, 10);
	};
	for (let i = 0; i < rest.length; i++) {
		const a = rest[i];
		if (a === "--keep-recent" && command === "prepare") opts.keepRecent = intArg(a, rest[++i]);
		else if (a === "--reserve" && command === "prepare") opts.reserve = intArg(a, rest[++i]);
		else if (a === "--leaf") {
			opts.leaf = rest[++i];
			if (!opts.leaf) throw new Error("--leaf needs an entry id");
		} else if (a === "--leaf-line") opts.leafLine = intArg(a, rest[++i]);
		else throw new Error(`unknown argument for ${command}: ${a}`);
	}
	if (opts.leaf !== undefined && opts.leafLine !== undefined) throw new Error("use --leaf or --leaf-line, not both");
	return opts;
}

/** Re-parse the original file exactly like pi's loadEntriesFromFile, remembering 1-based line numbers. */
function parseWithLines(content) {
	const lead = content.length - content.trimStart().length;
	let lineOffset = 0;
	for (let i = 0; i < lead; i++) if (content[i] === "\n") lineOffset++;
	const lines = content.trim().split("\n");
	const parsed = []; // {line, obj}
	for (let k = 0; k < lines.length; k++) {
		if (!lines[k].trim()) continue;
		try {
			parsed.push({ line: lineOffset + k + 1, obj: JSON.parse(lines[k]) });
		} catch {
			// pi skips malformed lines silently
		}
	}
	const nonBlankLines = content.split("\n").filter((l) => l.trim()).length;
	return { parsed, nonBlankLines };
}

/** Open FILE (copied into a temp dir) with pi's SessionManager; return everything the commands need. */
function openSession(pi, file) {
	let content;
	try {
		content = readFileSync(file, "utf8");
	} catch (e) {
		throw new Error(`cannot read ${file}: ${e.message}`);
	}
	const { parsed, nonBlankLines } = parseWithLines(content);
	const origHeader = parsed.length > 0 && parsed[0].obj.type === "session" && typeof parsed[0].obj.id === "string" ? parsed[0].obj : null;

	const dir = mkdtempSync(join(tmpdir(), "pi-oracle-"));
	try {
		const copy = join(dir, basename(file) || "session.jsonl");
		copyFileSync(file, copy);
		const manager = pi.sm.SessionManager.open(copy, dir);
		const header = manager.getHeader();
		const entries = manager.getEntries();

		// Map pi's entry objects to original line numbers (by position, verified by type+timestamp).
		const lineOf = new Map();
		if (origHeader) {
			const parsedEntries = parsed.filter((p) => p.obj.type !== "session");
			if (parsedEntries.length !== entries.length) {
				throw new Error(`line mapping failed: ${parsedEntries.length} parsed entries vs ${entries.length} pi entries`);
			}
			for (let i = 0; i < entries.length; i++) {
				const p = parsedEntries[i];
				const e = entries[i];
				if (p.obj.type !== e.type || p.obj.timestamp !== e.timestamp) {
					throw new Error(`line mapping failed at entry ${i} (line ${p.line}): ${p.obj.type}@${p.obj.timestamp} vs ${e.type}@${e.timestamp}`);
				}
				lineOf.set(e, p.line);
			}
		}
		return {
			manager,
			header,
			entries,
			lineOf,
			origVersion: origHeader ? (origHeader.version ?? 1) : null,
			headerValid: origHeader !== null,
			nonBlankLines,
		};
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
}

function resolveLeaf(session, opts) {
	if (opts.leafLine !== undefined) {
		for (const e of session.entries) if (session.lineOf.get(e) === opts.leafLine) return e.id;
		throw new Error(`--leaf-line ${opts.leafLine}: no entry comes from that line`);
	}
	if (opts.leaf !== undefined) {
		if (!session.manager.getEntry(opts.leaf)) throw new Error(`--leaf ${opts.leaf}: no such entry id`);
		return opts.leaf;
	}
	return session.manager.getLeafId();
}

function textOf(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((b) => b && b.type === "text" && typeof b.text === "string")
		.map((b) => b.text)
		.join("\n");
}

function imageCount(content) {
	return Array.isArray(content) ? content.filter((b) => b && b.type === "image").length : 0;
}

/** Match messages produced by pi back to the path entries they came from (-1 when not found). */
function messageSourceIndices(path, messages) {
	const out = [];
	let p = 0;
	for (const m of messages) {
		if (m.role === "compactionSummary") {
			// buildSessionContext emits the (last) compaction first, out of path order.
			let found = -1;
			for (let i = path.length - 1; i >= 0; i--) {
				if (path[i].type === "compaction" && path[i].summary === m.summary) {
					found = i;
					break;
				}
			}
			out.push(found);
			continue;
		}
		let found = -1;
		for (let i = p; i < path.length; i++) {
			const e = path[i];
			if (
				(e.type === "message" && e.message === m) ||
				(e.type === "custom_message" && m.role === "custom" && m.content === e.content && m.customType === e.customType) ||
				(e.type === "branch_summary" && m.role === "branchSummary" && m.summary === e.summary && m.fromId === e.fromId)
			) {
				found = i;
				break;
			}
		}
		if (found >= 0) p = found + 1;
		out.push(found);
	}
	return out;
}

function describeMessages(path, lineOf, messages) {
	const src = messageSourceIndices(path, messages);
	return messages.map((m, k) => {
		const i = src[k];
		const ref = { index: i, id: i >= 0 ? path[i].id : null, line: i >= 0 ? (lineOf.get(path[i]) ?? null) : null };
		return { ...ref, role: m.role };
	});
}

async function cmdPrepare(pi, opts) {
	const session = openSession(pi, opts.file);
	const leafId = resolveLeaf(session, opts);
	const path = session.manager.getBranch(leafId ?? undefined);
	const pathLineNumbers = path.map((e) => session.lineOf.get(e) ?? null);
	const settings = {
		...pi.comp.DEFAULT_COMPACTION_SETTINGS,
		...(opts.keepRecent !== undefined ? { keepRecentTokens: opts.keepRecent } : {}),
		...(opts.reserve !== undefined ? { reserveTokens: opts.reserve } : {}),
	};
	const base = {
		ok: true,
		piVersion: pi.version,
		settings,
		leafId,
		pathLength: path.length,
		pathLineNumbers,
		pathIds: path.map((e) => e.id),
		pathTypes: path.map((e) => (e.type === "message" ? `message:${e.message?.role}` : e.type)),
		// pi's estimateTokens() for each `message` entry of the path (null for other entry types).
		pathEntryTokens: path.map((e) => (e.type === "message" ? pi.comp.estimateTokens(e.message) : null)),
	};

	const prep = pi.comp.prepareCompaction(path, settings);
	if (!prep) {
		process.stdout.write(`${JSON.stringify({ ...base, result: null })}\n`);
		return;
	}

	// Recompute the boundary and the cut the way 0.73.1's prepareCompaction does (for reporting
	// indices), and check that it agrees with what pi itself returned.
	let prevCompactionIndex = -1;
	for (let i = path.length - 1; i >= 0; i--) {
		if (path[i].type === "compaction") {
			prevCompactionIndex = i;
			break;
		}
	}
	let boundaryStart = 0;
	if (prevCompactionIndex >= 0) {
		const fk = path.findIndex((e) => e.id === path[prevCompactionIndex].firstKeptEntryId);
		boundaryStart = fk >= 0 ? fk : prevCompactionIndex + 1;
	}
	const cut = pi.comp.findCutPoint(path, boundaryStart, path.length, settings.keepRecentTokens);
	const firstKeptIndex = path.findIndex((e) => e.id === prep.firstKeptEntryId);
	if (firstKeptIndex !== cut.firstKeptEntryIndex || cut.isSplitTurn !== prep.isSplitTurn) {
		throw new Error(
			`internal check failed: findCutPoint gave ${cut.firstKeptEntryIndex}/${cut.isSplitTurn}, prepareCompaction ${firstKeptIndex}/${prep.isSplitTurn}`,
		);
	}
	const toSummarize = describeMessages(path, session.lineOf, prep.messagesToSummarize);
	const prefix = describeMessages(path, session.lineOf, prep.turnPrefixMessages);
	const unmatched = [...toSummarize, ...prefix].filter((m) => m.index < 0).length;
	if (unmatched) throw new Error(`internal check failed: ${unmatched} messages could not be matched to path entries`);

	const { readFiles, modifiedFiles } = pi.utils.computeFileLists(prep.fileOps);
	const out = {
		...base,
		firstKeptEntryId: prep.firstKeptEntryId,
		firstKeptIndex,
		firstKeptLine: session.lineOf.get(path[firstKeptIndex]) ?? null,
		isSplitTurn: prep.isSplitTurn,
		turnStartIndex: cut.turnStartIndex,
		prevCompactionIndex,
		boundaryStart,
		tokensBefore: prep.tokensBefore,
		messagesToSummarize: toSummarize,
		turnPrefixMessages: prefix,
		previousSummary: prep.previousSummary ?? null,
		fileOps: { readFiles, modifiedFiles },
		fileOpsRaw: { read: [...prep.fileOps.read], written: [...prep.fileOps.written], edited: [...prep.fileOps.edited] },
	};
	process.stdout.write(`${JSON.stringify(out)}\n`);
}

function minimalMessage(m) {
	switch (m.role) {
		case "user":
			return { role: m.role, text: textOf(m.content), images: imageCount(m.content) };
		case "custom":
			return { role: m.role, customType: m.customType, text: textOf(m.content), images: imageCount(m.content) };
		case "branchSummary":
			return { role: m.role, text: m.summary, fromId: m.fromId };
		case "compactionSummary":
			return { role: m.role, summary: m.summary, tokensBefore: m.tokensBefore };
		case "assistant": {
			const content = Array.isArray(m.content) ? m.content : [];
			return {
				role: m.role,
				text: textOf(content),
				toolCallIds: content.filter((b) => b && b.type === "toolCall").map((b) => b.id),
				stopReason: m.stopReason,
			};
		}
		case "toolResult":
			return { role: m.role, toolCallId: m.toolCallId, toolName: m.toolName, isError: !!m.isError };
		case "bashExecution":
			return { role: m.role, command: m.command, excludeFromContext: !!m.excludeFromContext };
		default:
			return { role: m.role };
	}
}

async function cmdContext(pi, opts) {
	const session = openSession(pi, opts.file);
	const leafId = resolveLeaf(session, opts);
	// Module-level buildSessionContext(entries, leafId, byId), the same call SessionManager's method makes.
	const ctx = pi.sm.buildSessionContext(session.entries, leafId);
	const path = session.manager.getBranch(leafId ?? undefined);
	const src = messageSourceIndices(path, ctx.messages);

	const seenCalls = new Set();
	let orphanToolResults = 0;
	for (const m of ctx.messages) {
		if (m.role === "assistant" && Array.isArray(m.content)) {
			for (const b of m.content) if (b && b.type === "toolCall") seenCalls.add(b.id);
		} else if (m.role === "toolResult" && !seenCalls.has(m.toolCallId)) {
			orphanToolResults++;
		}
	}
	const out = {
		ok: true,
		piVersion: pi.version,
		sessionVersion: session.origVersion, // header version of the ORIGINAL file (missing = 1); null if no valid header
		migratedVersion: session.header?.version ?? null,
		headerValid: session.headerValid,
		entryCount: session.entries.length,
		nonBlankLines: session.nonBlankLines,
		skippedLines: session.nonBlankLines - session.entries.length - (session.headerValid ? 1 : 0),
		leafId,
		pathLength: path.length,
		thinkingLevel: ctx.thinkingLevel,
		model: ctx.model,
		hasCompaction: ctx.messages.some((m) => m.role === "compactionSummary"),
		orphanToolResults,
		messages: ctx.messages.map((m, k) => {
			const i = src[k];
			return { ...minimalMessage(m), index: i, line: i >= 0 ? (session.lineOf.get(path[i]) ?? null) : null };
		}),
	};
	process.stdout.write(`${JSON.stringify(out)}\n`);
}

async function main() {
	let opts;
	try {
		opts = parseArgs(process.argv.slice(2));
		const pi = await loadPi();
		if (opts.command === "prepare") await cmdPrepare(pi, opts);
		else await cmdContext(pi, opts);
	} catch (e) {
		fail(e?.message ?? e);
	}
}

await main();
