// The live page (docs/operations.md, "The live page"): the cluster from GET v1/cluster and readyz, a page
// of locks from GET v1/locks, kept current by the prefix watch GET v1/watch (server-sent events, read with
// fetch so that an API key can go with it). Everything it shows is set as text, never parsed as HTML: lock
// names, owners and values are whatever clients sent.
'use strict';

(() => {
  const KEY_STORAGE = 'holdfast-api-key';
  const PAGE_SIZE = 50;
  const CLUSTER_EVERY_MS = 1000;
  const TICK_MS = 200;
  const RETRY_MS = 1000;

  const page = {
    key: sessionStorage.getItem(KEY_STORAGE) || '',
    prefix: '',
    // The `after` of each page seen so far: '' for the first.
    cursors: [''],
    index: 0,
    // The shown page: lock name -> lock, as the API shows it.
    locks: new Map(),
    // The last name of the page when a next page exists (changes past it belong to later pages).
    end: null,
    next: null,
    // Bumped at each load: a load's watch stops when a newer load begins.
    generation: 0,
    watch: null,
    // The node's wall clock minus this browser's, from the last cluster read.
    offsetMs: 0,
  };

  const $ = (id) => document.getElementById(id);

  /** An element with `attrs` and children (strings become text nodes). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === 'class') node.className = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function headers() {
    return page.key ? { Authorization: 'Bearer ' + page.key } : {};
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function problemDetail(response) {
    try {
      const problem = await response.json();
      return problem.detail || problem.title || response.statusText;
    } catch (_) {
      return response.status + ' ' + response.statusText;
    }
  }

  function setLive(on, text) {
    const badge = $('live');
    badge.className = 'badge ' + (on ? 'on' : 'off');
    badge.textContent = text || (on ? 'live' : 'reconnecting');
  }

  // ---------------------------------------------------------------------------------------------------
  // The cluster.
  // ---------------------------------------------------------------------------------------------------

  async function refreshCluster() {
    try {
      const sent = Date.now();
      const response = await fetch('v1/cluster', { cache: 'no-store' });
      const cluster = await response.json();
      page.offsetMs = cluster.now_ms - (sent + Date.now()) / 2;
      const ready = await fetch('readyz', { cache: 'no-store' });
      renderCluster(cluster, ready.ok, (await ready.text()).trim());
    } catch (error) {
      $('cluster-summary').textContent = 'This node does not answer: ' + error.message;
      $('cluster-summary').className = 'bad';
    }
  }

  function renderCluster(cluster, ready, readiness) {
    $('served-by').textContent = 'node ' + cluster.id + ' (' + cluster.state.toLowerCase() + ')';
    const summary = $('cluster-summary');
    summary.className = ready ? '' : 'bad';
    summary.textContent =
      (cluster.leader ? 'Leader: node ' + cluster.leader : 'No leader known') +
      ' · term ' + cluster.term +
      ' · committed ' + cluster.committed_index +
      ' · applied ' + (cluster.applied_index ?? 0) +
      ' · this node ' + (ready ? 'ready' : 'not ready: ' + readiness);
    const leading = cluster.state === 'Leader';
    const rows = Object.entries(cluster.members).map(([id, addr]) => memberRow(cluster, Number(id), addr, leading));
    $('members').tBodies[0].replaceChildren(...rows);
    $('cluster-note').textContent = leading
      ? ''
      : 'A follower hears mostly from the leader: the leader\'s page shows how every member answers.';
  }

  function memberRow(cluster, id, addr, leading) {
    const role = id === cluster.leader ? 'leader' : cluster.learners.includes(id) ? 'learner' : 'follower';
    const self = id === cluster.id;
    let log = '–';
    let answer = el('span', { class: 'muted' }, '–');
    if (self) {
      log = 'last ' + (cluster.last_log_index ?? 0) + ', applied ' + (cluster.applied_index ?? 0);
      answer = el('span', { class: 'muted' }, 'this node');
    } else {
      const peer = cluster.peers[String(id)] || {};
      if (leading && peer.matched_index !== null && peer.matched_index !== undefined) {
        const lag = (cluster.last_log_index ?? 0) - peer.matched_index;
        log = 'matched ' + peer.matched_index + (lag > 0 ? ' (' + lag + ' behind)' : '');
      }
      if ((leading || id === cluster.leader) && peer.last_heard_ms !== null && peer.last_heard_ms !== undefined) {
        const ms = peer.last_heard_ms;
        const health = ms < 1000 ? 'ok' : ms < 5000 ? 'warn' : 'bad';
        answer = el('span', { class: health }, ms < 1000 ? ms + ' ms ago' : (ms / 1000).toFixed(1) + ' s ago');
      } else if (leading) {
        answer = el('span', { class: 'bad' }, 'not since this node started');
      }
    }
    return el('tr', { 'data-node': String(id) },
      el('td', {}, String(id) + (self ? ' (this node)' : '')),
      el('td', { class: 'name' }, addr),
      el('td', {}, role),
      el('td', {}, log),
      el('td', {}, answer));
  }

  // ---------------------------------------------------------------------------------------------------
  // The locks: a page, then its changes.
  // ---------------------------------------------------------------------------------------------------

  /** Whether `name` belongs on the page shown: under the prefix, after its cursor, not past its end. */
  function onPage(name) {
    // Names compare by UTF-16 code units here and by UTF-8 bytes on the node: the same order but for
    // characters past U+FFFF against U+E000-U+FFFF, where a change could land on the neighbouring page.
    const after = page.cursors[page.index];
    return name.startsWith(page.prefix) && (after === '' || name > after) && (page.end === null || name <= page.end);
  }

  async function load() {
    const generation = ++page.generation;
    if (page.watch) page.watch.abort();
    const query = new URLSearchParams({ prefix: page.prefix, limit: String(PAGE_SIZE) });
    const after = page.cursors[page.index];
    if (after) query.set('after', after);
    let response;
    try {
      response = await fetch('v1/locks?' + query, { headers: headers(), cache: 'no-store' });
    } catch (error) {
      return retryLoad(generation, 'This node does not answer: ' + error.message);
    }
    if (generation !== page.generation) return;
    if (response.status === 401) return askForKey(await problemDetail(response));
    if (!response.ok) return retryLoad(generation, await problemDetail(response));
    const list = await response.json();
    if (generation !== page.generation) return;
    showKeyState();
    page.locks = new Map(list.locks.map((lock) => [lock.name, lock]));
    page.next = list.next;
    page.end = list.next;
    renderLocks(new Set());
    watch(generation, list.revision);
  }

  async function retryLoad(generation, why) {
    setLive(false, 'reconnecting');
    $('locks-note').textContent = why;
    await sleep(RETRY_MS);
    if (generation === page.generation) load();
  }

  /** Follows the prefix watch from `revision`, resuming after the last event seen when it ends. */
  async function watch(generation, revision) {
    const controller = new AbortController();
    page.watch = controller;
    let last = revision;
    while (generation === page.generation) {
      try {
        const query = new URLSearchParams({ prefix: page.prefix, after: String(last) });
        const response = await fetch('v1/watch?' + query, { headers: headers(), signal: controller.signal });
        if (response.status === 401) return askForKey(await problemDetail(response));
        if (response.status === 409) return load(); // compacted: list again
        if (!response.ok) throw new Error(await problemDetail(response));
        setLive(true);
        for await (const event of serverEvents(response.body)) {
          if (generation !== page.generation) return;
          if (event.event !== 'lock') continue;
          last = event.id || last;
          change(JSON.parse(event.data));
        }
      } catch (error) {
        if (controller.signal.aborted) return;
        $('locks-note').textContent = 'The watch stopped: ' + error.message;
      }
      setLive(false);
      await sleep(RETRY_MS);
    }
  }

  /** The server-sent events of `body`: {event, id, data} for each, comments skipped. */
  async function* serverEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let blank;
      while ((blank = /\r?\n\r?\n/.exec(buffer))) {
        const block = buffer.slice(0, blank.index);
        buffer = buffer.slice(blank.index + blank[0].length);
        const event = { event: 'message', id: null, data: '' };
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'event') event.event = value;
          else if (field === 'id') event.id = value;
          else if (field === 'data') event.data += (event.data ? '\n' : '') + value;
        }
        if (event.data) yield event;
      }
    }
  }

  /** A lock's new state from the watch: shown, updated, or gone when nobody holds it. */
  function change(lock) {
    if (!onPage(lock.name)) return;
    if (lock.holders.length === 0 && lock.waiters.length === 0) page.locks.delete(lock.name);
    else page.locks.set(lock.name, lock);
    renderLocks(new Set([lock.name]));
  }

  function renderLocks(changed) {
    const names = [...page.locks.keys()].sort();
    const rows = names.map((name) => lockRow(page.locks.get(name), changed.has(name)));
    $('lock-table').tBodies[0].replaceChildren(...rows);
    $('page-info').textContent = 'page ' + (page.index + 1) + ' · ' + names.length + ' shown';
    $('prev').disabled = page.index === 0;
    $('next').disabled = !page.next;
    if (!names.length) $('locks-note').textContent = 'No lock is held' + (page.prefix ? ' under this prefix.' : '.');
    else $('locks-note').textContent = '';
    tick();
  }

  function lockRow(lock, changed) {
    const name = el('td', { class: 'name' }, lock.name);
    if (lock.limit > 1) name.append(el('span', { class: 'limit' }, lock.holders.length + ' of ' + lock.limit));
    const holders = el('ul', {}, ...lock.holders.map(holderItem));
    const waiters = el('ol', {}, ...lock.waiters.map((w) => el('li', {}, w.owner, el('span', { class: 'muted' },
      ' since ' + new Date(w.queued_at).toLocaleTimeString()))));
    return el('tr', { 'data-lock': lock.name, class: changed ? 'changed' : '' },
      name, el('td', {}, holders), el('td', {}, lock.waiters.length ? waiters : el('span', { class: 'muted' }, '–')));
  }

  function holderItem(holder) {
    const item = el('li', { class: 'holder' },
      holder.free_at_ms ? el('span', { class: 'muted' }, 'lock-delay after ' + holder.owner) : holder.owner,
      el('span', { class: 'muted' }, ' · fence '), el('span', { class: 'fence' }, String(holder.fence)));
    const value = holder.value !== undefined ? holder.value : holder.value_base64 !== undefined ? 'base64:' + holder.value_base64 : '';
    if (value) item.append(' · ', el('span', { class: 'value' }, value));
    item.append(' · ');
    if (holder.expires_at_ms) item.append(countdown(holder.expires_at_ms, 'left'));
    else if (holder.free_at_ms) item.append(countdown(holder.free_at_ms, 'until free'));
    else item.append(el('span', { class: 'muted' }, 'session ' + holder.session + ', while it heartbeats'));
    return item;
  }

  function countdown(endMs, what) {
    return el('span', { class: 'left', 'data-end': String(endMs), 'data-what': what });
  }

  /** Moves every countdown to the node's clock now. */
  function tick() {
    const now = Date.now() + page.offsetMs;
    for (const span of document.querySelectorAll('span.left')) {
      const left = Number(span.dataset.end) - now;
      span.textContent = left > 0 ? (left / 1000).toFixed(1) + ' s ' + span.dataset.what : 'ending';
      span.className = 'left ' + (left > 2000 ? 'ok' : left > 0 ? 'warn' : 'bad');
    }
  }

  // ---------------------------------------------------------------------------------------------------
  // The API key.
  // ---------------------------------------------------------------------------------------------------

  function askForKey(detail) {
    page.generation++;
    if (page.watch) page.watch.abort();
    setLive(false, 'needs an API key');
    $('auth').hidden = false;
    $('locks').hidden = true;
    $('auth-error').textContent = page.key ? detail : '';
    $('key').focus();
  }

  function showKeyState() {
    $('auth').hidden = true;
    $('locks').hidden = false;
    $('forget-key').hidden = !page.key;
  }

  function start() {
    $('key-form').addEventListener('submit', (event) => {
      event.preventDefault();
      page.key = $('key').value.trim();
      $('key').value = '';
      sessionStorage.setItem(KEY_STORAGE, page.key);
      load();
    });
    $('forget-key').addEventListener('click', () => {
      page.key = '';
      sessionStorage.removeItem(KEY_STORAGE);
      page.locks.clear();
      renderLocks(new Set());
      load();
    });
    let typing = null;
    $('prefix').addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        page.prefix = $('prefix').value;
        page.cursors = [''];
        page.index = 0;
        load();
      }, 250);
    });
    $('next').addEventListener('click', () => {
      page.cursors[page.index + 1] = page.next;
      page.index += 1;
      load();
    });
    $('prev').addEventListener('click', () => {
      page.index = Math.max(0, page.index - 1);
      load();
    });
    refreshCluster();
    setInterval(refreshCluster, CLUSTER_EVERY_MS);
    setInterval(tick, TICK_MS);
    load();
  }

  start();
})();
