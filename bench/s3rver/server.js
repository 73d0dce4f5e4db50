// s3rver (an S3 server over a directory, in Node.js) for bench/s3_servers.py: prints its
// endpoint as one JSON line, then answers one JSON command per stdin line:
//   {"do": "seed", "bucket", "keys", "data"}  objects written straight into its directory
//   {"do": "count"}                           requests answered by method since the last count
// Seeding writes s3rver's own layout (an object file and its md5 beside it): creating
// 100k objects over HTTP would take longer than what is measured.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const readline = require('readline');
const S3rver = require('s3rver');
const FilesystemStore = require('s3rver/lib/stores/filesystem');

const directory = process.argv[2];
const server = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory, vhostBuckets: false });
let counts = {};
server.middleware.unshift(async (ctx, next) => {
  counts[ctx.method] = (counts[ctx.method] || 0) + 1;
  await next();
});
const store = new FilesystemStore(directory);

function seed({ bucket, keys, data }) {
  const body = Buffer.from(data, 'base64');
  const md5 = crypto.createHash('md5').update(body).digest('hex');
  fs.mkdirSync(store.getBucketPath(bucket), { recursive: true });
  const made = new Set();
  for (const key of keys) {
    const object = store.getResourcePath(bucket, key, 'object');
    const dir = path.dirname(object);
    if (!made.has(dir)) {
      fs.mkdirSync(dir, { recursive: true });
      made.add(dir);
    }
    fs.writeFileSync(object, body);
    fs.writeFileSync(`${object}.md5`, md5);
  }
  return {};
}

server.run().then(({ port }) => {
  console.log(JSON.stringify({ endpoint: `http://127.0.0.1:${port}` }));
  const lines = readline.createInterface({ input: process.stdin });
  lines.on('line', line => {
    const command = JSON.parse(line);
    let answer = {};
    if (command.do === 'seed') answer = seed(command);
    else [answer, counts] = [counts, {}];
    console.log(JSON.stringify(answer));
  });
  lines.on('close', () => server.close());
});
