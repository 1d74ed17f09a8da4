// What busboy (and so multer) and formidable see in multipart bodies.
// stdin: one JSON object per line, {"ct": Content-Type, "body": base64}; stdout: one line per body, in order,
// {"busboy": VIEW, "formidable": VIEW}, where VIEW is {"error": message or null, "parts": [[name, filename, file]]}:
// every part the parser reported before it finished or failed, its field name and filename (null when it has none,
// as the parser reads them) and whether the parser itself hands it over as a file.
import { createInterface } from 'node:readline';
import { Readable, Writable } from 'node:stream';
import busboy from 'busboy';
import formidable from 'formidable';

function viaBusboy(ct, body, parts) {
  return new Promise((resolve) => {
    let bb;
    try {
      bb = busboy({ headers: { 'content-type': ct } });
    } catch (err) {
      resolve({ error: String(err.message), parts });
      return;
    }
    let done = false;
    const finish = (error) => {
      if (!done) {
        done = true;
        resolve({ error, parts });
      }
    };
    bb.on('file', (name, stream, info) => {
      parts.push([name ?? null, info.filename ?? null, true]);
      stream.on('error', () => {}); // the parser's own error says it
      stream.resume();
    });
    bb.on('field', (name) => parts.push([name ?? null, null, false]));
    bb.on('error', (err) => finish(String(err.message)));
    bb.on('close', () => finish(null));
    bb.end(body);
  });
}

const nowhere = () => new Writable({ write(_chunk, _encoding, callback) { callback(); } });

function viaFormidable(ct, body, parts) {
  return new Promise((resolve) => {
    const form = formidable({
      // Parsing only: whatever the size, nothing written to disk.
      allowEmptyFiles: true,
      minFileSize: 0,
      fileWriteStreamHandler: nowhere,
    });
    form.onPart = (part) => {
      // formidable hands a part over as a file when it has a Content-Type (Formidable._handlePart).
      parts.push([part.name ?? null, part.originalFilename ?? null, Boolean(part.mimetype)]);
      return form._handlePart(part);
    };
    const req = Readable.from([body]);
    req.headers = { 'content-type': ct, 'content-length': String(body.length) };
    form.parse(req).then(
      () => resolve({ error: null, parts }),
      (err) => resolve({ error: String(err.message), parts }),
    );
  });
}

// A parser that neither finishes nor fails on a body would stall the batch: after a while it counts as failed.
async function settled(parse, ct, body) {
  const parts = [];
  let timer;
  const stalled = new Promise((resolve) => {
    timer = setTimeout(() => resolve({ error: 'stalled: neither finished nor failed', parts }), 2000);
  });
  try {
    return await Promise.race([parse(ct, body, parts), stalled]);
  } finally {
    clearTimeout(timer);
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line) continue;
  const { ct, body } = JSON.parse(line);
  const bytes = Buffer.from(body, 'base64');
  const seen = { busboy: await settled(viaBusboy, ct, bytes), formidable: await settled(viaFormidable, ct, bytes) };
  if (!process.stdout.write(JSON.stringify(seen) + '\n')) {
    await new Promise((resolve) => process.stdout.once('drain', resolve));
  }
}
