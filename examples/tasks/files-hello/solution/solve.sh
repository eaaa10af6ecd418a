#!/bin/bash
echo hello > out.txt
