// Validates histd's Kubernetes manifests offline:
//
//   node validate.mjs --modules DIR [--repo ROOT]
//
// DIR is the node_modules folder where package-lock.json's packages are
// installed (npm ci). Checked, for deploy/k8s/*.yaml and for the Helm chart
// rendered with its default values and with its optional parts switched:
//   1. every document against the Kubernetes API schema of its kind
//      (kubernetes-models: the OpenAPI schemas of Kubernetes, compiled by
//      ajv), with unknown fields rejected as kubeconform -strict does;
//   2. histd's own rules: readiness on the native gRPC health check,
//      liveness a TCP connect (never the health check, which follows the
//      storage), every probe on the gRPC port, a preStop hook and a
//      termination grace that cover the drain, resource requests and
//      limits, selectors that match, and the Secret and ConfigMap keys
//      histd reads.
// Prints "ok - ..." / "not ok - ..." lines and "N passed, N failed"; exits 1
// on any failure. Where `helm` is on PATH, `helm template` is checked too.
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { pathToFileURL, fileURLToPath } from 'node:url';
import { makeRenderer } from './render.mjs';

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : def;
};
const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.resolve(opt('--modules', path.join(here, 'node_modules')));
const repo = path.resolve(opt('--repo', path.join(here, '..', '..')));
const require = createRequire(path.join(modules, 'noop.js'));
const YAML = require('yaml');
const render = makeRenderer(YAML);

let passed = 0;
let failed = 0;
function check(name, errors) {
  if (errors.length === 0) {
    passed++;
    console.log(`ok - ${name}`);
  } else {
    failed++;
    console.log(`not ok - ${name}`);
    for (const e of errors.slice(0, 20)) console.log(`    ${e}`);
  }
}

// ---------------------------------------------------------------------------
// Schemas

const modelsDir = path.join(modules, 'kubernetes-models');

function modelFile(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  return path.join(modelsDir, group, version, `${kind}`);
}

async function schemaErrors(obj) {
  const base = modelFile(obj.apiVersion, obj.kind);
  if (!fs.existsSync(base + '.js')) return [`no schema for ${obj.apiVersion} ${obj.kind}`];
  const mod = await import(pathToFileURL(base + '.js'));
  const Model = mod[obj.kind];
  const errors = [];
  try {
    new Model(obj).validate();
  } catch (e) {
    errors.push(...String(e.message).split('\n'));
  }
  strictCheck(obj, `I${obj.kind}`, base + '.d.ts', '', errors);
  return errors;
}

// The schemas allow unknown fields, as the API server's OpenAPI does; a typo
// ("readinesProbe") would pass. The models' type declarations list every
// field, so walk them to reject what no field names.
const dtsCache = new Map();
function readDts(file) {
  if (dtsCache.has(file)) return dtsCache.get(file);
  const info = { imports: new Map(), interfaces: new Map() };
  dtsCache.set(file, info);
  if (!fs.existsSync(file)) return info;
  const src = fs.readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '');
  for (const m of src.matchAll(/import\s*\{([^}]+)\}\s*from\s*"([^"]+)"/g)) {
    const spec = m[2].replace(/\.js$/, '') + '.d.ts';
    const target = spec.startsWith('.') ? path.resolve(path.dirname(file), spec) : path.join(modules, spec);
    for (const name of m[1].split(',')) {
      const parts = name.trim().split(/\s+as\s+/);
      if (parts[0]) info.imports.set(parts[parts.length - 1], target);
    }
  }
  for (const m of src.matchAll(/export interface (\w+)[^{]*\{/g)) {
    let depth = 1;
    let k = m.index + m[0].length;
    const start = k;
    while (depth > 0 && k < src.length) {
      if (src[k] === '{') depth++;
      else if (src[k] === '}') depth--;
      k++;
    }
    const body = src.slice(start, k - 1);
    const props = new Map();
    // Top-level members only: "name"?: Type;
    let d = 0;
    let cur = '';
    for (const ch of body) {
      if (ch === '{' || ch === '<') d++;
      if (ch === '}' || ch === '>') d--;
      if (ch === ';' && d === 0) {
        const pm = cur.trim().match(/^"([^"]+)"\??:\s*([\s\S]+)$/);
        if (pm) props.set(pm[1], pm[2].trim());
        cur = '';
      } else {
        cur += ch;
      }
    }
    info.interfaces.set(m[1], props);
  }
  // export type { IPodTemplateSpec as IIoK8sApiCoreV1PodTemplateSpec, ... }
  for (const m of src.matchAll(/export type \{([^}]+)\}/g)) {
    for (const pair of m[1].split(',')) {
      const [from, to] = pair.trim().split(/\s+as\s+/);
      if (to && info.interfaces.has(from)) info.interfaces.set(to, info.interfaces.get(from));
    }
  }
  return info;
}

function findInterface(name, file) {
  const info = readDts(file);
  if (info.interfaces.has(name)) return { props: info.interfaces.get(name), file };
  if (info.imports.has(name)) {
    const other = readDts(info.imports.get(name));
    if (other.interfaces.has(name)) return { props: other.interfaces.get(name), file: info.imports.get(name) };
  }
  return null;
}

function strictCheck(value, type, file, where, errors) {
  type = type.trim();
  let m;
  if ((m = type.match(/^Array<([\s\S]+)>$/))) {
    if (Array.isArray(value)) value.forEach((v, i) => strictCheck(v, m[1], file, `${where}[${i}]`, errors));
    return;
  }
  if ((m = type.match(/^\{\s*\[key: string\]:\s*([\s\S]+?);?\s*\}$/))) {
    if (value && typeof value === 'object') {
      for (const [k, v] of Object.entries(value)) strictCheck(v, m[1], file, `${where}.${k}`, errors);
    }
    return;
  }
  if (!/^I\w+$/.test(type) || !value || typeof value !== 'object' || Array.isArray(value)) return;
  const iface = findInterface(type, file);
  if (!iface) return;
  for (const [k, v] of Object.entries(value)) {
    if (!iface.props.has(k)) errors.push(`${where}.${k}: unknown field`);
    else strictCheck(v, iface.props.get(k), iface.file, `${where}.${k}`, errors);
  }
}

// ---------------------------------------------------------------------------
// histd's own rules, over one set of manifests (deploy/k8s or a rendering)

function histdRules(docs) {
  const errors = [];
  const byKind = (k) => docs.filter((d) => d.kind === k);
  const deps = byKind('Deployment');
  if (deps.length !== 1) return [`want one Deployment, got ${deps.length}`];
  const dep = deps[0];
  const pod = dep.spec.template.spec;
  const podLabels = dep.spec.template.metadata.labels || {};
  const selects = (sel) => sel && Object.entries(sel).every(([k, v]) => podLabels[k] === v);
  const c = pod.containers.find((x) => x.name === 'histd');
  if (!c) return ['no container named histd'];

  const grpcPort = (c.ports || []).find((p) => p.name === 'grpc');
  if (!grpcPort) errors.push('container: no port named grpc');
  // A probe's port: a number, or the name of one of the container's ports.
  const portOf = (port) => (typeof port === 'string'
    ? ((c.ports || []).find((p) => p.name === port) || {}).containerPort
    : port);
  // Readiness is the gRPC health check. Liveness must not be: every name
  // histd's health answers ("" and histd.v1.HistoryService, server/health.c)
  // is NOT_SERVING while the storage does not answer, and any other name is
  // NOT_FOUND, so a grpc liveness probe restarts every replica during a
  // database outage. Liveness is a TCP connect to the gRPC port.
  const r = c.readinessProbe;
  if (!r || !r.grpc) errors.push('readinessProbe: must be a native grpc probe');
  else if (r.grpc.service !== 'histd.v1.HistoryService') {
    errors.push('readinessProbe: should ask for service histd.v1.HistoryService');
  }
  const l = c.livenessProbe;
  if (!l) errors.push('livenessProbe: not set');
  else if (l.grpc) {
    errors.push(`livenessProbe: the gRPC health check (service ${JSON.stringify(l.grpc.service ?? '')}) ` +
      'turns NOT_SERVING in a storage outage and would restart every replica; use tcpSocket on the gRPC port');
  } else if (!l.tcpSocket) errors.push('livenessProbe: want tcpSocket on the gRPC port');
  for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
    const p = c[probe];
    const on = p && (p.grpc || p.tcpSocket);
    if (on && grpcPort && portOf(on.port) !== grpcPort.containerPort) {
      errors.push(`${probe}: port ${on.port} is not the grpc port ${grpcPort.containerPort}`);
    }
  }
  for (const kind of ['requests', 'limits']) {
    for (const r of ['cpu', 'memory']) {
      if (!c.resources || !c.resources[kind] || c.resources[kind][r] === undefined) {
        errors.push(`resources.${kind}.${r} is not set`);
      }
    }
  }

  // The drain: preStop sleep, then SIGTERM and HISTD_SHUTDOWN_GRACE.
  const cms = byKind('ConfigMap');
  const env = Object.assign({}, ...cms.map((m) => m.data || {}));
  for (const e of c.env || []) if (e.value !== undefined) env[e.name] = e.value;
  const cmd = c.lifecycle && c.lifecycle.preStop && c.lifecycle.preStop.exec && c.lifecycle.preStop.exec.command;
  const sleep = cmd && /sleep$/.test(cmd[0]) ? Number(cmd[1]) : NaN;
  if (!Number.isFinite(sleep)) errors.push('preStop: want exec ["/bin/sleep", N]');
  const grace = Number(env.HISTD_SHUTDOWN_GRACE ?? 10);
  const term = pod.terminationGracePeriodSeconds ?? 30;
  if (Number.isFinite(sleep) && term < sleep + grace + 1) {
    errors.push(`terminationGracePeriodSeconds ${term} < preStop ${sleep} + HISTD_SHUTDOWN_GRACE ${grace} + 1`);
  }

  // The ports histd listens on (HISTD_LISTEN, default 0.0.0.0:50051, and
  // HISTD_METRICS_LISTEN) are the ports the container, its probes and the
  // Prometheus annotation name: a port changed in one place only leaves
  // histd listening where nothing looks.
  const portIn = (addr) => {
    const m = /:(\d+)$/.exec(String(addr));
    return m ? Number(m[1]) : NaN;
  };
  const listen = portIn(env.HISTD_LISTEN ?? '0.0.0.0:50051');
  if (grpcPort && grpcPort.containerPort !== listen) {
    errors.push(`HISTD_LISTEN ${env.HISTD_LISTEN} is not on the grpc port ${grpcPort.containerPort}`);
  }
  for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
    const p = c[probe];
    const on = p && (p.grpc || p.tcpSocket);
    if (on && portOf(on.port) !== listen) errors.push(`${probe}: port ${on.port} is not the HISTD_LISTEN port ${listen}`);
  }
  const metricsPort = (c.ports || []).find((p) => p.name === 'metrics');
  const scrape = (dep.spec.template.metadata.annotations || {})['prometheus.io/port'];
  if (metricsPort || scrape !== undefined) {
    const mlisten = portIn(env.HISTD_METRICS_LISTEN);
    if (!env.HISTD_METRICS_LISTEN) errors.push('HISTD_METRICS_LISTEN is not set, but a metrics port is declared');
    else {
      if (metricsPort && metricsPort.containerPort !== mlisten) {
        errors.push(`HISTD_METRICS_LISTEN ${env.HISTD_METRICS_LISTEN} is not on the metrics port ${metricsPort.containerPort}`);
      }
      if (scrape !== undefined && Number(scrape) !== mlisten) {
        errors.push(`prometheus.io/port ${scrape} is not the HISTD_METRICS_LISTEN port ${mlisten}`);
      }
    }
  }

  // Config: every ConfigMap key is a histd setting; the keys file is mounted.
  for (const k of Object.keys(env)) if (!/^HISTD_[A-Z0-9_]+$/.test(k)) errors.push(`ConfigMap key ${k} is not HISTD_*`);
  const refs = (c.envFrom || []).map((e) => e.configMapRef && e.configMapRef.name);
  for (const m of cms) if (!refs.includes(m.metadata.name)) errors.push(`ConfigMap ${m.metadata.name} is not used`);
  if (env.HISTD_DRIVER === 'postgres' && !(c.env || []).some((e) => e.name === 'HISTD_DSN' && e.valueFrom && e.valueFrom.secretKeyRef)) {
    errors.push('HISTD_DSN must come from a Secret');
  }
  const keysFile = env.HISTD_API_KEYS_FILE;
  if (!keysFile) {
    errors.push('HISTD_API_KEYS_FILE is not set (auth needs it)');
  } else {
    const mount = (c.volumeMounts || []).find((v) => keysFile.startsWith(v.mountPath + '/'));
    const vol = mount && (pod.volumes || []).find((v) => v.name === mount.name);
    if (!vol || !vol.secret) errors.push(`HISTD_API_KEYS_FILE ${keysFile} is not on a mounted Secret`);
  }
  for (const s of byKind('Secret')) {
    const keys = Object.keys({ ...(s.data || {}), ...(s.stringData || {}) });
    for (const k of ['api-keys', 'dsn']) if (!keys.includes(k)) errors.push(`Secret ${s.metadata.name}: no key ${k}`);
  }

  for (const s of byKind('Service')) {
    if (!selects(s.spec.selector)) errors.push(`Service ${s.metadata.name}: selector does not match the pods`);
    const p = (s.spec.ports || []).find((x) => x.name === 'grpc');
    if (!p || (p.targetPort !== 'grpc' && p.targetPort !== (grpcPort && grpcPort.containerPort))) {
      errors.push(`Service ${s.metadata.name}: no grpc port to the container's grpc port`);
    }
  }
  for (const p of byKind('PodDisruptionBudget')) {
    if (!selects(p.spec.selector && p.spec.selector.matchLabels)) errors.push('PodDisruptionBudget: selector does not match the pods');
  }
  for (const h of byKind('HorizontalPodAutoscaler')) {
    const t = h.spec.scaleTargetRef;
    if (t.kind !== 'Deployment' || t.name !== dep.metadata.name) errors.push('HorizontalPodAutoscaler: does not target the Deployment');
    if (dep.spec.replicas !== undefined && byKind('HorizontalPodAutoscaler').length && docs.helm) {
      errors.push('Deployment: replicas is set while the autoscaler owns it');
    }
    if (!(h.spec.minReplicas >= 2)) errors.push('HorizontalPodAutoscaler: minReplicas < 2 leaves no pod during a drain');
  }
  return errors;
}

// ---------------------------------------------------------------------------

function parseDocs(text, name) {
  const docs = [];
  const errors = [];
  for (const d of YAML.parseAllDocuments(text)) {
    if (d.errors.length) errors.push(...d.errors.map((e) => `${name}: ${e.message}`));
    const v = d.toJS();
    if (v) docs.push(v);
  }
  return { docs, errors };
}

async function validateSet(label, files) {
  const all = [];
  for (const { name, text } of files) {
    const { docs, errors } = parseDocs(text, name);
    if (errors.length) {
      check(`${label}: ${name} parses as YAML`, errors);
      continue;
    }
    for (const d of docs) {
      const what = `${label}: ${name}: ${d.kind} ${d.metadata && d.metadata.name}`;
      check(`${what} matches the Kubernetes schema`, await schemaErrors(d));
      all.push(d);
    }
  }
  return all;
}

const k8sDir = path.join(repo, 'deploy', 'k8s');
const k8sFiles = fs.readdirSync(k8sDir).filter((f) => /\.ya?ml$/.test(f)).sort()
  .map((f) => ({ name: `k8s/${f}`, text: fs.readFileSync(path.join(k8sDir, f), 'utf8') }));
const plain = await validateSet('manifests', k8sFiles);
check('manifests: histd rules (probes, drain, resources, selectors, secrets)', histdRules(plain));
const kinds = plain.map((d) => d.kind).sort().join(',');
check('manifests: Deployment, Service, ConfigMap, Secret, PDB and HPA are all there',
  kinds === 'ConfigMap,Deployment,HorizontalPodAutoscaler,PodDisruptionBudget,Secret,Service' ? [] : [`have ${kinds}`]);

const chartDir = path.join(repo, 'deploy', 'helm', 'histd');
const variants = [
  ['chart (defaults)', {}],
  ['chart (no autoscaling, no PDB, existing Secret)', {
    autoscaling: { enabled: false }, podDisruptionBudget: { enabled: false },
    secret: { create: false, existingSecret: 'histd-secrets' },
  }],
];
// Ports other than the defaults must reach histd's listen addresses (the
// ConfigMap), not only the container ports and probes; an address set in
// env is kept as it is.
const portVariants = [
  ['chart (grpcPort 6000, metricsPort 9100)', { grpcPort: 6000, metricsPort: 9100 },
    { HISTD_LISTEN: '0.0.0.0:6000', HISTD_METRICS_LISTEN: '0.0.0.0:9100' }],
  ['chart (HISTD_LISTEN set in env)', { env: { HISTD_LISTEN: '[::]:50051' } },
    { HISTD_LISTEN: '[::]:50051', HISTD_METRICS_LISTEN: '0.0.0.0:9090' }],
];
for (const [label, values, want] of [...variants, ...portVariants]) {
  let rendered;
  try {
    rendered = render(chartDir, { releaseName: 'demo', values });
  } catch (e) {
    check(`${label}: renders`, [e.message]);
    continue;
  }
  const docs = await validateSet(label, rendered.map((r) => ({ name: r.file, text: r.text })));
  docs.helm = true;
  check(`${label}: histd rules`, histdRules(docs));
  if (want) {
    const data = (docs.find((d) => d.kind === 'ConfigMap') || {}).data || {};
    check(`${label}: the ConfigMap listens on ${Object.values(want).join(' and ')}`,
      Object.entries(want).filter(([k, v]) => data[k] !== v).map(([k, v]) => `${k} is ${data[k]}, want ${v}`));
  }
}
try {
  render(chartDir, { values: { secret: { create: false, existingSecret: '' } } });
  check('chart: secret.create=false without existingSecret is refused', ['it rendered']);
} catch (e) {
  check('chart: secret.create=false without existingSecret is refused', /existingSecret/.test(e.message) ? [] : [e.message]);
}

// The validator must catch what it claims to: a typo, a wrong type, a bad
// drain budget.
{
  const dep = structuredClone(plain.find((d) => d.kind === 'Deployment'));
  dep.spec.template.spec.containers[0].readinesProbe = dep.spec.template.spec.containers[0].readinessProbe;
  const e1 = await schemaErrors(dep);
  check('validator rejects an unknown field (readinesProbe)', e1.some((e) => /readinesProbe: unknown field/.test(e)) ? [] : ['accepted']);
  const dep2 = structuredClone(plain.find((d) => d.kind === 'Deployment'));
  dep2.spec.replicas = 'two';
  check('validator rejects a wrong type (replicas: "two")', (await schemaErrors(dep2)).length ? [] : ['accepted']);
  const set = structuredClone(plain);
  set.find((d) => d.kind === 'Deployment').spec.template.spec.terminationGracePeriodSeconds = 10;
  check('validator rejects a grace shorter than the drain', histdRules(set).some((e) => /terminationGrace/.test(e)) ? [] : ['accepted']);
  const live = structuredClone(plain);
  live.find((d) => d.kind === 'Deployment').spec.template.spec.containers[0].livenessProbe = { grpc: { port: 50051 } };
  check('validator rejects a liveness probe on the gRPC health check',
    histdRules(live).some((e) => /livenessProbe: the gRPC health check/.test(e)) ? [] : ['accepted']);
  const moved = structuredClone(plain);
  moved.find((d) => d.kind === 'ConfigMap').data.HISTD_LISTEN = '0.0.0.0:6000';
  moved.find((d) => d.kind === 'ConfigMap').data.HISTD_METRICS_LISTEN = '0.0.0.0:9100';
  const movedErrors = histdRules(moved);
  check('validator rejects listen ports that are not the container, probe and scrape ports',
    ['HISTD_LISTEN', 'readinessProbe: port', 'HISTD_METRICS_LISTEN', 'prometheus.io/port']
      .filter((w) => !movedErrors.some((e) => e.startsWith(w))).map((w) => `no error for ${w}`));
}

// Real Helm, where there is one.
let helm = null;
try {
  execFileSync('helm', ['version'], { stdio: 'ignore' });
  helm = 'helm';
} catch {
  console.log('# helm is not installed: the chart was rendered by render.mjs only');
}
if (helm) {
  const text = execFileSync(helm, ['template', 'demo', chartDir], { encoding: 'utf8' });
  const docs = await validateSet('helm template', [{ name: 'helm template', text }]);
  docs.helm = true;
  check('helm template: histd rules', histdRules(docs));
  const ours = render(chartDir, { releaseName: 'demo' }).flatMap((r) => parseDocs(r.text, r.file).docs);
  const norm = (ds) => JSON.stringify(ds.map((d) => `${d.kind}/${d.metadata.name}`).sort());
  check('helm template and render.mjs give the same objects', norm(docs) === norm(ours) ? [] : [norm(docs), norm(ours)]);
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
