/// A Node preload (`--require`) that sends the `https` module's requests through
/// `HTTPS_PROXY` with `CONNECT`, as curl does: Node before 24 reads no proxy variable.
/// It replaces `https.globalAgent`, so requests that bring their own agent are theirs.
/// Shared by `pingate env`, which writes it to the state directory for the shell, and by
/// the harness, which gives it to the `--app` it runs (issue 33: a Node app went around the
/// gate in the harness's legs).
public enum NodeProxyPreload {
    /// The preload's JavaScript.
    public static let source = """
    // Written by `pingate env`: sends Node's https requests through HTTPS_PROXY (a CONNECT
    // tunnel), honouring NO_PROXY. Node before 24 reads no proxy variable by itself.
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
      class PingateTunnelAgent extends https.Agent {
        createConnection(options, callback) {
          const host = String(options.host || options.hostname || 'localhost').toLowerCase();
          const port = options.port || 443;
          if (bypass(host)) return super.createConnection(options, callback);
          const authority = (host.includes(':') ? '[' + host + ']' : host) + ':' + port;
          const request = http.request({
            host: proxyURL.hostname.replace(/^\\[|\\]$/g, ''), port: proxyURL.port || 80,
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
            // No SNI for an address, as Node's own TLS leaves it out.
            const servername = options.servername || (net.isIP(host) ? undefined : host);
            callback(null, tls.connect({ ...options, socket, servername }));
          });
          request.once('error', callback);
          request.end();
        }
      }
      https.globalAgent = new PingateTunnelAgent({ keepAlive: true });
    }

    """
}
