// phonehome fleet status page. No dependencies, no inline script (CSP).
// The read token lives in sessionStorage and goes only into the
// Authorization header of calls to /api/v1/status/...
'use strict';
(function () {
  const KEY = 'phonehome.status.token';
  const TENANT = 'phonehome.status.tenant';
  const $ = (id) => document.getElementById(id);
  const view = $('view');
  const COLORS = ['#1d4ed8', '#b42318', '#116329', '#9a6700', '#6f42c1', '#0e7490', '#be185d', '#57606a'];

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'text') e.textContent = v; else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  function fmt(n) {
    if (n === undefined || n === null) return '–';
    if (typeof n !== 'number') return String(n);
    if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(2) + 'G';
    if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + 'M';
    if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + 'k';
    return Number.isInteger(n) ? String(n) : n.toFixed(2);
  }
  function ago(iso) {
    if (!iso) return 'never';
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 90) return Math.round(s) + ' s ago';
    if (s < 5400) return Math.round(s / 60) + ' min ago';
    return (s / 3600).toFixed(1) + ' h ago';
  }
  // A figure linked to its source: the PromQL (shown on its own page, to
  // paste into Grafana) or the /metrics series.
  function linked(text, src) {
    if (!src || (!src.promql && !src.metric)) return document.createTextNode(text);
    const title = src.promql ? 'PromQL: ' + src.promql : '/metrics: ' + src.metric;
    const href = '#/source?' + new URLSearchParams({ promql: src.promql || '', metric: src.metric || '' });
    return el('a', { href, title, class: 'src', text });
  }

  function token() { return sessionStorage.getItem(KEY); }
  function tenantParam() {
    const t = sessionStorage.getItem(TENANT);
    return t ? { tenant: t } : {};
  }
  async function api(path, params) {
    const q = new URLSearchParams(Object.assign({}, tenantParam(), params || {}));
    const res = await fetch('/api/v1/status/' + path + (q.toString() ? '?' + q : ''), {
      headers: { Authorization: 'Bearer ' + token() }, credentials: 'omit', cache: 'no-store',
    });
    if (res.status === 401) { logout('Your token was not accepted.'); throw new Error('unauthorized'); }
    const body = await res.json();
    if (body.status !== 'success') throw new Error(body.error || res.statusText);
    return body.data;
  }

  function logout(msg) {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(TENANT);
    showLogin(msg);
  }
  function showLogin(msg) {
    view.replaceChildren();
    $('login').hidden = false;
    $('logout').hidden = true;
    $('tenant-picker').hidden = true;
    $('login-error').textContent = msg || '';
    $('token').focus();
  }

  // Chart: an SVG line chart of one or more series over shared times.
  function chart(title, times, lines, unit) {
    const W = 400, H = 150, L = 44, B = 18, T = 18;
    const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    svg.setAttribute('class', 'chart');
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', title);
    const ns = (tag, attrs, text) => {
      const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text !== undefined) e.textContent = text;
      svg.append(e);
      return e;
    };
    ns('title', {}, title);
    ns('text', { x: L, y: 12 }, title + (unit ? ' (' + unit + ')' : ''));
    let max = 0;
    for (const l of lines) for (const v of l.values) max = Math.max(max, v);
    if (max === 0) max = 1;
    const t0 = times[0] || 0, t1 = times[times.length - 1] || 1;
    const x = (t) => L + (W - L - 6) * (t1 === t0 ? 1 : (t - t0) / (t1 - t0));
    const y = (v) => H - B - (H - B - T) * (v / max);
    ns('line', { x1: L, y1: H - B, x2: W - 6, y2: H - B, class: 'axis' });
    ns('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' });
    ns('text', { x: 2, y: T + 4 }, fmt(max));
    ns('text', { x: 2, y: H - B }, '0');
    if (times.length) {
      ns('text', { x: L, y: H - 4 }, new Date(t0 * 1000).toLocaleTimeString());
      ns('text', { x: W - 70, y: H - 4 }, new Date(t1 * 1000).toLocaleTimeString());
    }
    lines.forEach((l, i) => {
      const pts = l.values.map((v, k) => `${x(times[k]).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
      const p = ns('polyline', { points: pts, fill: 'none', stroke: COLORS[i % COLORS.length], 'stroke-width': 1.5, 'data-series': l.name, 'data-points': l.values.length });
      p.append(document.createElementNS('http://www.w3.org/2000/svg', 'title'));
      p.firstChild.textContent = l.name;
    });
    const legend = el('div', { class: 'legend' });
    lines.forEach((l, i) => {
      const sw = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
      sw.setAttribute('width', '10'); sw.setAttribute('height', '10'); sw.setAttribute('aria-hidden', 'true');
      const r = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
      r.setAttribute('width', '10'); r.setAttribute('height', '10'); r.setAttribute('fill', COLORS[i % COLORS.length]);
      sw.append(r);
      legend.append(el('span', {}, sw, ' ' + l.name));
    });
    return el('figure', {}, svg, el('figcaption', {}, legend));
  }

  function card(title, value, src, limit, note) {
    return el('div', { class: 'card' }, el('h3', { text: title }),
      el('div', { class: 'big' }, linked(fmt(value), src)),
      limit ? el('div', { class: 'limit', text: 'limit ' + fmt(limit) }) : null,
      note ? el('div', { class: 'limit partial', text: note }) : null);
  }
  // A samples/s figure is over the last completed 10 min window; until
  // one has completed (a receiver or cluster just started) it is over the
  // part elapsed, and says so.
  function partialNote(partial, secs) {
    if (!partial) return null;
    const span = secs < 90 ? Math.round(secs) + ' s' : Math.round(secs / 60) + ' min';
    return 'partial: over the last ' + span + ', no 10 min window complete yet';
  }
  function rateCell(c) {
    const w = Math.round(c.samples_per_second_window_seconds) || 600;
    const range = w % 60 === 0 ? (w / 60) + 'm' : w + 's';
    const note = partialNote(c.samples_per_second_partial, w);
    return el('td', { class: 'num', title: note || undefined },
      linked(fmt(c.samples_per_second), { promql: `sum(count_over_time({_id="${c.id}"}[${range}])) / ${w}` }),
      note ? el('span', { class: 'partial', text: ' (partial)' }) : null);
  }

  async function overview() {
    const [o, h] = await Promise.all([api('overview'), api('history', { hours: 6 })]);
    const c = o.clusters;
    const st = o.storage || {};
    const s = (k) => st[k] ? st[k] : { value: undefined, source: {} };
    const refused = Object.entries(o.refused_last_hour);
    const versions = Object.entries(o.gathering.clusters_by_version);
    view.replaceChildren(
      el('h2', { text: 'Tenant ' + o.tenant }),
      el('h3', { text: 'Clusters' }),
      el('div', { class: 'cards', id: 'cluster-cards' },
        card('Reporting now', c.reporting.value, c.reporting.source),
        card('Seen in the last 1 h', c.last_1h.value, c.last_1h.source),
        card('Seen in the last 24 h', c.last_24h.value, c.last_24h.source),
        card('Gone silent (> ' + Math.round(o.silent_after_seconds / 60) + ' min)', c.silent.value, null)),
      el('h3', { text: 'Cost' }),
      el('div', { class: 'cards' },
        card('Active series', o.series.value, o.series.source, o.series.limit),
        card('Samples/s', o.samples_per_second.value, o.samples_per_second.source, o.samples_per_second.limit,
          partialNote(o.samples_per_second.partial, o.samples_per_second.window_seconds)),
        card('WAL size (bytes)', s('wal_bytes').value, s('wal_bytes').source),
        card('Head series', s('head_series').value, s('head_series').source),
        card('Head chunks (bytes)', s('head_chunks_bytes').value, s('head_chunks_bytes').source),
        card('Bucket upload lag (s)', s('bucket_lag_seconds').value, s('bucket_lag_seconds').source)),
      el('div', { class: 'charts' },
        chart('Ingest rate', h.t, [{ name: 'samples/s', values: h.samples_per_second }], 'samples/s'),
        chart('Refusals by reason', h.t, Object.entries(h.refused_per_second).map(([k, v]) => ({ name: k, values: v })), 'samples/s'),
        chart('Clusters reporting', h.t, [{ name: 'clusters', values: h.clusters_reporting }], '')),
      el('h3', { text: 'Refused in the last hour' }),
      refused.length ? table(['Reason', 'Samples'], refused.map(([k, v]) => [k, linked(fmt(v), o.refused_source)])) : el('p', { text: 'Nothing refused.' }),
      el('h3', { text: 'Gathering definition' }),
      el('p', {}, 'In force: ', el('code', { text: o.gathering.in_force || 'none' })),
      versions.length ? table(['Version clusters report', 'Clusters'], versions.map(([k, v]) => [k || '(none)', linked(fmt(v), o.gathering.source)])) : null,
      el('h3', { text: 'Forwarders' }),
      table(['Client', 'Clusters'], Object.entries(o.clients).map(([k, v]) => [k || '(unknown)', fmt(v)])),
    );
  }

  function table(heads, rows, caption) {
    return el('table', {}, caption ? el('caption', { text: caption }) : null,
      el('thead', {}, el('tr', {}, ...heads.map((h) => el('th', { scope: 'col', text: h })))),
      el('tbody', {}, ...rows.map((r) => el('tr', {}, ...r.map((c) => el('td', {}, c instanceof Node ? c : String(c)))))));
  }

  const COLS = [['id', 'Cluster (_id)'], ['last_seen', 'Last seen'], ['series', 'Series / limit'], ['samples_per_second', 'Samples/s'],
    ['refused', 'Refused'], [null, 'Forwarder'], [null, 'Definition'], [null, 'Protocol']];

  async function clusters(params) {
    const p = { q: params.get('q') || '', sort: params.get('sort') || 'id', order: params.get('order') || 'asc', offset: params.get('offset') || '0', limit: '50' };
    const d = await api('clusters', p);
    const go = (changes) => { location.hash = '#/clusters?' + new URLSearchParams(Object.assign({}, p, changes)); };
    const search = el('input', { id: 'search', type: 'search', value: p.q, placeholder: 'prefix of _id' });
    const form = el('form', { class: 'controls', role: 'search', id: 'search-form' },
      el('label', { for: 'search', text: 'Search by _id prefix ' }), search, el('button', { type: 'submit', text: 'Search' }));
    form.addEventListener('submit', (e) => { e.preventDefault(); go({ q: search.value, offset: 0 }); });
    const head = el('tr', {}, ...COLS.map(([key, label]) => {
      if (!key) return el('th', { scope: 'col', text: label });
      const active = d.sort === key;
      const b = el('button', { type: 'button', text: label + (active ? (d.order === 'asc' ? ' ▲' : ' ▼') : '') });
      b.addEventListener('click', () => go({ sort: key, order: active && d.order === 'asc' ? 'desc' : 'asc', offset: 0 }));
      return el('th', { scope: 'col', 'aria-sort': active ? (d.order === 'asc' ? 'ascending' : 'descending') : 'none', class: key === 'id' || key === 'last_seen' ? '' : 'num' }, b);
    }));
    const rows = d.clusters.map((c) => el('tr', {},
      el('th', { scope: 'row' }, el('a', { href: '#/cluster/' + encodeURIComponent(c.id), text: c.id })),
      el('td', { class: 'state-' + c.state, title: c.last_seen || '' }, ago(c.last_seen) + ' (' + c.state + ')'),
      el('td', { class: 'num' }, linked(fmt(c.series), { promql: `count({_id="${c.id}"})` }), ' / ' + fmt(c.series_limit)),
      rateCell(c),
      el('td', { class: 'num', text: Object.entries(c.refused).map(([k, v]) => k + ': ' + fmt(v)).join(', ') || '0' }),
      el('td', { text: c.forwarder_version || c.client || '–' }),
      el('td', {}, linked(c.definition_version || '–', { promql: `phonehome_gathering_definition_info{_id="${c.id}"}` })),
      el('td', { text: c.protocol || '–' })));
    const off = Number(p.offset);
    const prev = el('button', { type: 'button', text: '← Previous' });
    const next = el('button', { type: 'button', text: 'Next →' });
    prev.disabled = off === 0;
    next.disabled = off + d.limit >= d.matched;
    prev.addEventListener('click', () => go({ offset: Math.max(0, off - d.limit) }));
    next.addEventListener('click', () => go({ offset: off + d.limit }));
    view.replaceChildren(el('h2', { text: 'Clusters' }), form,
      el('p', { id: 'matched', text: `${d.matched} of ${d.total} clusters match; showing ${d.matched ? off + 1 : 0}–${off + d.clusters.length}.` }),
      el('table', { id: 'clusters' }, el('caption', { text: 'Clusters, sortable by the column headers' }), el('thead', {}, head), el('tbody', {}, ...rows)),
      el('div', { class: 'pager' }, prev, next));
  }

  async function cluster(id) {
    const d = await api('clusters/' + encodeURIComponent(id), { hours: 6 });
    const c = d.cluster;
    view.replaceChildren(
      el('h2', {}, 'Cluster ', el('code', { text: c.id })),
      el('div', { class: 'cards' },
        card('Last seen', ago(c.last_seen) + ' (' + c.state + ')', null),
        card('Active series', c.series, d.sources.series, c.series_limit),
        card('Samples/s', c.samples_per_second, d.sources.samples_per_second, null,
          partialNote(c.samples_per_second_partial, c.samples_per_second_window_seconds)),
        card('Refused samples', c.refused_total, null),
        card('Forwarder', c.forwarder_version || c.client || '–', null),
        card('Definition version', c.definition_version || '–', d.sources.definition_version),
        card('Remote-write protocol', c.protocol || '–', null)),
      el('div', { class: 'charts', id: 'cluster-charts' },
        chart('Samples/s, last 6 h', d.chart.t, [{ name: 'samples/s', values: d.chart.samples_per_second }], 'samples/s'),
        chart('Series, last 6 h', d.chart.t, [{ name: 'series', values: d.chart.series }], '')),
      el('h3', { text: 'Refusals by reason' }),
      Object.keys(c.refused).length ? table(['Reason', 'Samples'], Object.entries(c.refused).map(([k, v]) => [k, fmt(v)])) : el('p', { text: 'None.' }),
      el('h3', { text: 'Recent refusals' }),
      d.recent_refusals.length ? el('div', { id: 'refusals' }, table(['Time', 'Reason', 'Samples', 'Example refused series'], d.recent_refusals.map((r) => [new Date(r.time).toLocaleString(), r.reason, fmt(r.samples), el('code', { text: r.example || '(whole request)' })]))) : el('p', { text: 'None recently.' }),
      el('h3', {}, 'Series per metric name (', linked('PromQL', d.sources.series_by_metric), ')'),
      table(['Metric', 'Series'], d.series_by_metric.map((m) => [m.metric, fmt(m.series)])),
    );
  }

  function source(params) {
    const promql = params.get('promql'), metric = params.get('metric');
    view.replaceChildren(el('h2', { text: 'Where this figure comes from' }),
      promql ? el('p', {}, 'PromQL over the fleet\'s data (paste it into Grafana\'s Explore on this receiver\'s data source): ', el('code', { text: promql })) : null,
      metric ? el('p', {}, 'The receiver\'s own series ', el('code', { text: metric }), ' on ', el('a', { href: '/metrics', text: '/metrics' }), '.') : null,
      el('p', {}, el('a', { href: '#/', text: 'Back to the overview' })));
  }

  async function render() {
    if (!token()) { showLogin(); return; }
    $('login').hidden = true;
    $('logout').hidden = false;
    const [path, query] = (location.hash.slice(1) || '/').split('?');
    const params = new URLSearchParams(query || '');
    try {
      await tenants();
      if (path.startsWith('/cluster/')) await cluster(decodeURIComponent(path.slice('/cluster/'.length)));
      else if (path === '/clusters') await clusters(params);
      else if (path === '/source') source(params);
      else await overview();
    } catch (e) {
      if (e.message !== 'unauthorized') view.replaceChildren(el('p', { class: 'error', role: 'alert', text: 'Error: ' + e.message }));
    }
  }

  let tenantsLoaded = false;
  async function tenants() {
    if (tenantsLoaded) return;
    const d = await api('tenants');
    tenantsLoaded = true;
    if (d.tenants.length > 1) {
      const sel = $('tenant');
      sel.replaceChildren(...d.tenants.map((t) => el('option', { value: t, text: t })));
      sel.value = d.current;
      $('tenant-picker').hidden = false;
    }
  }

  $('login-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $('token').value.trim());
    $('token').value = '';
    tenantsLoaded = false;
    try {
      await api('tenants');
    } catch (err) {
      if (err.message !== 'unauthorized') { sessionStorage.removeItem(KEY); showLogin('This token may not read: ' + err.message); }
      return;
    }
    render();
  });
  $('logout').addEventListener('click', () => { tenantsLoaded = false; logout(); });
  $('tenant').addEventListener('change', (e) => { sessionStorage.setItem(TENANT, e.target.value); render(); });
  window.addEventListener('hashchange', render);
  render();
})();
