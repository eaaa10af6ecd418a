#!/bin/bash
grep skip list.txt > summary.txt
