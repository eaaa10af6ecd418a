#!/bin/bash
grep retry lines.txt > out.txt
