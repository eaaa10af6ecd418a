#!/bin/bash
grep skip records.txt > total.txt
