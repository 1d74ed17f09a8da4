// Multipart bodies as Node clients write them, for the same forms.
// stdin: a JSON array of forms, each a list of fields {name, value} or {name, filename, type, data (base64)};
// stdout: one line per form and writer, {"form": index, "writer": name, "ct": Content-Type, "body": base64}.
// Writers: undici (Node's own FormData and fetch), form-data (the package), axios (its FormData serializer) and
// axios-form-data (axios posting a form-data instance). axios writes to the network only, so its requests go to a
// server on 127.0.0.1 that records them.
import { createServer } from 'node:http';
import axios from 'axios';
import FormDataPackage from 'form-data';

const input = await new Promise((resolve) => {
  const chunks = [];
  process.stdin.on('data', (c) => chunks.push(c));
  process.stdin.on('end', () => resolve(JSON.parse(Buffer.concat(chunks).toString())));
});

function specForm(fields) {
  const form = new FormData();
  for (const f of fields) {
    if (f.data === undefined) form.append(f.name, f.value);
    else form.append(f.name, new Blob([Buffer.from(f.data, 'base64')], { type: f.type ?? '' }), f.filename);
  }
  return form;
}

function packageForm(fields) {
  const form = new FormDataPackage();
  for (const f of fields) {
    if (f.data === undefined) form.append(f.name, f.value);
    else {
      const options = { filename: f.filename };
      if (f.type) options.contentType = f.type;
      form.append(f.name, Buffer.from(f.data, 'base64'), options);
    }
  }
  return form;
}

const recorded = [];
const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    recorded.push({ ct: req.headers['content-type'], body: Buffer.concat(chunks) });
    res.end('ok');
  });
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const url = `http://127.0.0.1:${server.address().port}/`;

async function viaAxios(form, headers) {
  recorded.length = 0;
  await axios.post(url, form, { headers, timeout: 5000, proxy: false });
  return recorded[0];
}

const out = (form, writer, ct, body) =>
  process.stdout.write(JSON.stringify({ form, writer, ct, body: Buffer.from(body).toString('base64') }) + '\n');

try {
  for (const [i, fields] of input.entries()) {
    const response = new Response(specForm(fields));
    out(i, 'undici', response.headers.get('content-type'), await response.arrayBuffer());
    const pkg = packageForm(fields);
    out(i, 'form-data', pkg.getHeaders()['content-type'], pkg.getBuffer());
    const a = await viaAxios(specForm(fields), {});
    out(i, 'axios', a.ct, a.body);
    const pkg2 = packageForm(fields);
    const b = await viaAxios(pkg2, pkg2.getHeaders());
    out(i, 'axios-form-data', b.ct, b.body);
  }
} finally {
  server.close();
}
