/// A Node preload (`--require`) that sends the `https` module's requests and `fetch()`
/// through `HTTPS_PROXY` with `CONNECT`, as curl does: Node before 24 reads no proxy variable.
/// It replaces `https.globalAgent`, so requests that bring their own agent are theirs; and it
/// gives `fetch()` (undici inside Node, which Node does not export) a new dispatcher of the
/// class Node installed, whose `connect` opens the tunnel. An app's own dispatcher is its own.
/// Shared by `pingate env`, which writes it to the state directory for the shell, and by
/// the harness, which gives it to the `--app` it runs (issue 33: a Node app went around the
/// gate in the harness's legs, and Node 20's `fetch()` went direct).
public enum NodeProxyPreload {
    /// The preload's JavaScript.
    public static let source = #"""
    // Written by `pingate env`: sends Node's https requests and fetch() through HTTPS_PROXY (a
    // CONNECT tunnel), honouring NO_PROXY. Node before 24 reads no proxy variable by itself.
    'use strict';
    const proxy = process.env.HTTPS_PROXY || process.env.https_proxy;
    let proxyURL = null;
    try {
      proxyURL = proxy ? new URL(proxy.includes('://') ? proxy : 'http://' + proxy) : null;
    } catch (error) {
      // A proxy value Node cannot read must not stop every Node program in the shell.
      process.emitWarning('pingate: HTTPS_PROXY ' + JSON.stringify(proxy) + ' is not a URL; requests go direct');
    }
    if (proxyURL) {
      const http = require('http');
      const https = require('https');
      const net = require('net');
      const tls = require('tls');
      const noProxy = (process.env.NO_PROXY || process.env.no_proxy || '')
        .split(',').map((entry) => entry.trim().toLowerCase()).filter(Boolean);
      const bypass = (host) => noProxy.some((entry) => entry === '*' || host === entry
        || host.endsWith(entry.startsWith('.') ? entry : '.' + entry));
      // No SNI for an address, as Node's own TLS leaves it out.
      const serverName = (host, given) => given || (net.isIP(host) ? undefined : host);

      // Opens a CONNECT tunnel to host:port and calls back with its socket, or with an error
      // that carries the gate's refusal reason.
      const openTunnel = (host, port, callback) => {
        const authority = (host.includes(':') ? '[' + host + ']' : host) + ':' + port;
        const request = http.request({
          host: proxyURL.hostname.replace(/^\[|\]$/g, ''), port: proxyURL.port || 80,
          method: 'CONNECT', path: authority, headers: { host: authority },
          agent: false, // the tunnel's own connection: never pooled, never proxied again
        });
        request.once('connect', (response, socket) => {
          if (response.statusCode !== 200) {
            socket.destroy();
            const reason = response.headers['pingate-refusal'] ? ' (' + response.headers['pingate-refusal'] + ')' : '';
            callback(new Error('the proxy refused CONNECT ' + authority + ': ' + response.statusCode + reason));
            return;
          }
          callback(null, socket);
        });
        // undici's own connector gives up after 10 s; a proxy that takes the connection and
        // never answers the CONNECT must not hold a request forever.
        request.setTimeout(10000, () => request.destroy(new Error('the proxy did not answer CONNECT ' + authority + ' within 10 s')));
        request.once('error', callback);
        request.end();
      };

      class PingateTunnelAgent extends https.Agent {
        createConnection(options, callback) {
          const host = String(options.host || options.hostname || 'localhost').toLowerCase();
          const port = options.port || 443;
          if (bypass(host)) return super.createConnection(options, callback);
          openTunnel(host, port, (error, socket) => {
            if (error) return callback(error);
            callback(null, tls.connect({ ...options, socket, servername: serverName(host, options.servername) }));
          });
        }
      }
      https.globalAgent = new PingateTunnelAgent({ keepAlive: true });

      // fetch() is undici inside Node, which does not export it. Its global dispatcher is an
      // undici Agent: a new Agent of the same class, whose connect function opens the tunnel,
      // takes its place now, before the app runs, so that everything else on that dispatcher
      // (WebSocket and EventSource in Node 22, the undici package's own request) goes through
      // the gate too, and a dispatcher the app sets later is its own. Where that cannot be
      // done, fetch() fails and says why, rather than going around the gate.
      const major = Number(process.versions.node.split('.')[0]);
      const nodeProxiesFetch = major >= 24 && process.env.NODE_USE_ENV_PROXY === '1';
      const nativeFetch = globalThis.fetch;
      if (typeof nativeFetch === 'function' && !nodeProxiesFetch) {
        const dispatcherKey = Symbol.for('undici.globalDispatcher.1');
        const connect = (options, callback) => {
          let answered = false;
          const answer = (error, socket) => {
            if (answered) return;
            answered = true;
            error ? callback(error, null) : callback(null, socket);
          };
          const host = String(options.hostname || 'localhost').toLowerCase().replace(/^\[|\]$/g, '');
          const secure = options.protocol === 'https:';
          const port = Number(options.port) || (secure ? 443 : 80);
          const servername = serverName(host, options.servername);
          const secureOver = (socket) => {
            const secured = tls.connect({ socket, host, port, servername, ALPNProtocols: ['http/1.1'] });
            secured.once('secureConnect', () => answer(null, secured));
            secured.once('error', answer);
          };
          if (!secure || bypass(host)) {
            // Plain http and NO_PROXY hosts go direct, as curl sends them with HTTPS_PROXY alone.
            const socket = net.connect({ host, port });
            socket.once('error', answer);
            socket.once('connect', () => secure ? secureOver(socket) : answer(null, socket));
            return;
          }
          openTunnel(host, port, (error, socket) => error ? answer(error) : secureOver(socket));
        };
        let failure = null;
        const route = () => {
          // Loads undici, which installs its Agent; an empty URL is refused before any I/O.
          if (globalThis[dispatcherKey] === undefined) nativeFetch('').catch(() => {});
          const current = globalThis[dispatcherKey];
          if (current === undefined || typeof current.constructor !== 'function') {
            failure = new Error('pingate: fetch() cannot be sent through HTTPS_PROXY on Node ' + process.version
              + ': it has no undici dispatcher to replace; use the https module, or Node 24 or later with NODE_USE_ENV_PROXY=1');
          } else if (current.constructor.name === 'Agent') {
            globalThis[dispatcherKey] = new current.constructor({ connect });
          }
          // Any other dispatcher was chosen by the app (or by Node for its own proxy support): it is the app's.
        };
        route();
        if (failure) {
          globalThis.fetch = function fetch() { return Promise.reject(failure); };
        }
      }
    }
    """#
}
