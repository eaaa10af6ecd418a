#!/bin/bash
jq -r .version pkg.json > version.txt
