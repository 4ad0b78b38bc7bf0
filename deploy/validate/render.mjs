// A renderer for the subset of Helm's template language that
// deploy/helm/histd uses, so that the chart is rendered and validated on a
// machine without Helm (make test). Where `helm` is installed, validate.mjs
// also checks `helm template` itself.
//
// Supported: {{ pipeline }}, {{- and -}} trimming, {{/* comments */}},
// if / else if / else / end, define / include, values as .Values.a.b,
// .Release.Name, .Release.Namespace, .Release.Service, .Chart.<field>, $,
// and the functions listed in FUNCS. Anything else is an error, so a
// template that drifts beyond the subset fails loudly instead of rendering
// something Helm would not.
import fs from 'node:fs';
import path from 'node:path';

export function makeRenderer(YAML) {
  const FUNCS = {
    include: (ctx, name, data) => ctx.include(name, data),
    toYaml: (_c, v) => (v === undefined || v === null ? 'null' : YAML.stringify(v).replace(/\n$/, '')),
    nindent: (_c, n, s) => '\n' + indent(n, s),
    indent: (_c, n, s) => indent(n, s),
    quote: (_c, ...v) => v.map((x) => JSON.stringify(str(x))).join(' '),
    default: (_c, d, v) => (truthy(v) ? v : d),
    printf: (_c, fmt, ...args) => sprintf(fmt, args),
    trunc: (_c, n, s) => str(s).slice(0, n),
    trimSuffix: (_c, suf, s) => (str(s).endsWith(suf) ? str(s).slice(0, -suf.length) : str(s)),
    required: (_c, msg, v) => {
      if (!truthy(v)) throw new Error(msg);
      return v;
    },
    b64enc: (_c, s) => Buffer.from(str(s)).toString('base64'),
    toString: (_c, v) => str(v),
    not: (_c, v) => !truthy(v),
    and: (_c, ...v) => v.every(truthy),
    or: (_c, ...v) => v.some(truthy),
    eq: (_c, a, b) => a === b,
    ne: (_c, a, b) => a !== b,
  };

  function str(v) {
    if (v === undefined || v === null) return '';
    return typeof v === 'object' ? JSON.stringify(v) : String(v);
  }
  function truthy(v) {
    if (Array.isArray(v)) return v.length > 0;
    if (v && typeof v === 'object') return Object.keys(v).length > 0;
    return !!v;
  }
  function indent(n, s) {
    const pad = ' '.repeat(n);
    return str(s).split('\n').map((l) => pad + l).join('\n');
  }
  function sprintf(fmt, args) {
    let i = 0;
    return fmt.replace(/%[sdv%]/g, (m) => (m === '%%' ? '%' : str(args[i++])));
  }

  // Text and actions, with trimming applied.
  function lex(src, file) {
    const out = [];
    let pos = 0;
    while (pos < src.length) {
      const open = src.indexOf('{{', pos);
      if (open < 0) {
        out.push({ text: src.slice(pos) });
        break;
      }
      const close = src.indexOf('}}', open);
      if (close < 0) throw new Error(`${file}: unclosed {{`);
      let body = src.slice(open + 2, close);
      let text = src.slice(pos, open);
      if (body.startsWith('-')) {
        text = text.replace(/\s+$/, '');
        body = body.slice(1);
      }
      let trimAfter = false;
      if (body.endsWith('-')) {
        trimAfter = true;
        body = body.slice(0, -1);
      }
      out.push({ text });
      body = body.trim();
      if (!(body.startsWith('/*') && body.endsWith('*/'))) out.push({ action: body });
      pos = close + 2;
      if (trimAfter) pos += src.slice(pos).match(/^\s*/)[0].length;
    }
    return out;
  }

  // A tree of nodes; defines go into `defs`.
  function parse(tokens, file, defs) {
    let i = 0;
    function block(stopAt) {
      const nodes = [];
      while (i < tokens.length) {
        const t = tokens[i++];
        if (t.text !== undefined) {
          if (t.text) nodes.push({ text: t.text });
          continue;
        }
        const a = t.action;
        const word = a.split(/\s+/)[0];
        if (word === 'end' || word === 'else') {
          if (!stopAt) throw new Error(`${file}: unexpected {{ ${a} }}`);
          return { nodes, stop: a };
        }
        if (word === 'if') {
          nodes.push(ifNode(a.slice(2).trim()));
        } else if (word === 'define') {
          const name = JSON.parse(a.slice(6).trim());
          const r = block(true);
          if (r.stop !== 'end') throw new Error(`${file}: define ${name} without end`);
          defs[name] = r.nodes;
        } else if (['range', 'with', 'template', 'block'].includes(word)) {
          throw new Error(`${file}: {{ ${word} }} is outside the supported subset`);
        } else {
          nodes.push({ pipe: a });
        }
      }
      if (stopAt) throw new Error(`${file}: missing {{ end }}`);
      return { nodes };
    }
    function ifNode(cond) {
      const r = block(true);
      const node = { cond, then: r.nodes, else: [] };
      if (r.stop === 'else') {
        const r2 = block(true);
        if (r2.stop !== 'end') throw new Error(`${file}: else without end`);
        node.else = r2.nodes;
      } else if (r.stop.startsWith('else if ')) {
        node.else = [ifNode(r.stop.slice(8).trim())];
      } else if (r.stop !== 'end') {
        throw new Error(`${file}: unexpected {{ ${r.stop} }}`);
      }
      return node;
    }
    return block(false).nodes;
  }

  function splitWords(s) {
    const words = [];
    const re = /"(?:[^"\\]|\\.)*"|[^\s|]+|\|/g;
    let m;
    while ((m = re.exec(s))) words.push(m[0]);
    return words;
  }

  function evalPipe(pipe, dot, ctx) {
    const words = splitWords(pipe);
    const cmds = [[]];
    for (const w of words) {
      if (w === '|') cmds.push([]);
      else cmds[cmds.length - 1].push(w);
    }
    let value;
    cmds.forEach((cmd, k) => {
      if (cmd.length === 0) throw new Error(`empty command in {{ ${pipe} }}`);
      const [head, ...rest] = cmd;
      if (FUNCS[head]) {
        const args = rest.map((w) => operand(w, dot, ctx));
        if (k > 0) args.push(value);
        value = FUNCS[head](ctx, ...args);
      } else {
        if (k > 0 || rest.length) throw new Error(`unknown function ${head} in {{ ${pipe} }}`);
        value = operand(head, dot, ctx);
      }
    });
    return value;
  }

  function operand(w, dot, ctx) {
    if (w.startsWith('"')) return JSON.parse(w);
    if (/^-?\d+(\.\d+)?$/.test(w)) return Number(w);
    if (w === 'true' || w === 'false') return w === 'true';
    if (w === 'nil') return null;
    if (w === '.') return dot;
    if (w === '$') return ctx.root;
    let base = dot;
    let rest = w;
    if (w.startsWith('$.')) {
      base = ctx.root;
      rest = w.slice(1);
    }
    if (!rest.startsWith('.')) throw new Error(`unsupported operand ${w}`);
    let v = base;
    for (const part of rest.slice(1).split('.')) v = v == null ? undefined : v[part];
    return v;
  }

  function exec(nodes, dot, ctx) {
    let out = '';
    for (const n of nodes) {
      if (n.text !== undefined) out += n.text;
      else if (n.pipe !== undefined) out += str(evalPipe(n.pipe, dot, ctx));
      else out += exec(truthy(evalPipe(n.cond, dot, ctx)) ? n.then : n.else, dot, ctx);
    }
    return out;
  }

  function deepMerge(a, b) {
    if (!b || typeof b !== 'object' || Array.isArray(b)) return b === undefined ? a : b;
    const out = { ...(a && typeof a === 'object' ? a : {}) };
    for (const [k, v] of Object.entries(b)) out[k] = deepMerge(out[k], v);
    return out;
  }

  // Renders a chart folder; returns [{ file, text }] of its manifests.
  return function render(chartDir, { releaseName = 'histd', namespace = 'default', values = {} } = {}) {
    const chart = YAML.parse(fs.readFileSync(path.join(chartDir, 'Chart.yaml'), 'utf8'));
    const defaults = YAML.parse(fs.readFileSync(path.join(chartDir, 'values.yaml'), 'utf8')) || {};
    const root = {
      Values: deepMerge(defaults, values),
      Release: { Name: releaseName, Namespace: namespace, Service: 'Helm' },
      Chart: { ...chart, Name: chart.name, Version: chart.version, AppVersion: chart.appVersion },
    };
    const tdir = path.join(chartDir, 'templates');
    const files = fs.readdirSync(tdir).sort();
    const defs = {};
    const trees = {};
    for (const f of files) {
      trees[f] = parse(lex(fs.readFileSync(path.join(tdir, f), 'utf8'), f), f, defs);
    }
    const ctx = {
      root,
      include(name, data) {
        if (!defs[name]) throw new Error(`include of unknown template ${name}`);
        return exec(defs[name], data, ctx);
      },
    };
    const out = [];
    for (const f of files) {
      if (f.startsWith('_') || f === 'NOTES.txt' || !/\.ya?ml$/.test(f)) continue;
      let text;
      try {
        text = exec(trees[f], root, ctx);
      } catch (e) {
        throw new Error(`${f}: ${e.message}`);
      }
      if (text.trim()) out.push({ file: `templates/${f}`, text });
    }
    return out;
  };
}
