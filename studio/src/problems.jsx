// The workflow files the server could not serve (`GET /runner/workflows`), each problem at its
// file:line:col with its code, message and help — what `runner dev` shows after each reload.
export function Problems({ workflows, reload }) {
  if (workflows === undefined) return <div class="empty">…</div>;
  if (workflows === null)
    return (
      <div class="empty" data-testid="problems-unavailable">
        This server does not list its workflow files (no <code>/runner/workflows</code>).
      </div>
    );
  const rejected = workflows.rejected || [];
  return (
    <div class="problems" data-testid="problems">
      <div class="row spread">
        <h1>Workflow files</h1>
        <button type="button" onClick={reload}>
          Check again
        </button>
      </div>
      <p class="muted">
        {(workflows.graphs || []).length} served{workflows.reloaded_at ? `, read at ${new Date(workflows.reloaded_at).toLocaleTimeString()}` : ""}
        {workflows.dev ? " · reloaded as files change" : ""}
      </p>
      {!rejected.length && <div class="empty">Every workflow file is served.</div>}
      {rejected.map((r) => (
        <section key={r.file} class="rejected" data-testid="rejected" data-file={r.file}>
          <h2>
            <code>{r.file}</code> is not served
          </h2>
          <ul>
            {(r.diagnostics || []).map((d, i) => (
              <li key={i} class={`diag sev-${d.severity}`} data-testid="diagnostic">
                <code class="where">
                  {d.file || r.file}:{d.line}:{d.col}
                </code>{" "}
                <span class="badge err">{d.code}</span> {d.message}
                {d.help && <div class="help">help: {d.help}</div>}
              </li>
            ))}
          </ul>
        </section>
      ))}
      <h2>Served</h2>
      <ul class="list">
        {(workflows.graphs || []).map((g) => (
          <li key={g.graph_id}>
            <a href={`#/graph/${encodeURIComponent(g.graph_id)}`}>{g.graph_id}</a> <span class="muted">{g.file}</span>
          </li>
        ))}
      </ul>
    </div>
  );
}
